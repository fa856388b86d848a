"""The load generator's staggered clients (sidecar/devtools/traffic.py, ``stagger_s``): the capture
benchmark relies on client n starting n * stagger_s after the first, and on unstaggered clients
starting together."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp import web

from sidecar.devtools.traffic import run_load


async def _serve_completions(request: web.Request) -> web.StreamResponse:
    """A streaming completions endpoint: three tokens 0.2 s apart, then usage, then [DONE]."""
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for _ in range(3):
        await resp.write(b"data: " + json.dumps({"choices": [{"text": "x"}]}).encode() + b"\n\n")
        await asyncio.sleep(0.2)
    usage = {"choices": [], "usage": {"completion_tokens": 3}}
    await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    assert body["stream"] is True
    return resp


async def _load(stagger_s: float):
    app = web.Application()
    app.router.add_post("/v1/completions", _serve_completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        began = time.time()
        # Each request takes about 0.6 s and the run 0.5 s: every client sends exactly one.
        result = await run_load(f"http://127.0.0.1:{port}", "m", concurrency=4, duration_s=0.5, max_tokens=3,
                                stagger_s=stagger_s)
        return began, result
    finally:
        await runner.cleanup()


def test_staggered_clients_start_stagger_apart():
    began, result = asyncio.run(_load(0.15))
    assert len(result.results) == 4 and not result.failures
    firsts = sorted(r.arrivals[0] - began for r in result.results)
    # One request per client: client n's first token comes after n * 0.15 s.
    for n, first in enumerate(firsts):
        assert first >= n * 0.15 - 0.005, firsts
    assert firsts[-1] - firsts[0] >= 0.4, firsts


def test_clients_without_stagger_start_together():
    began, result = asyncio.run(_load(0.0))
    firsts = sorted(r.arrivals[0] - began for r in result.results)
    assert len(firsts) == 4 and firsts[-1] - firsts[0] < 0.3, firsts
