"""A real probe and the real sidecar app, in this process, over real sockets: the mutual
challenge–response (each side proves it knows the token, neither sends it), then a capture that
writes under the probe's own trace root; and each side refusing the other when the tokens differ."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time

import pytest
from aiohttp import web

from sidecar.probe import Probe
from sidecar.service.app import ServiceSettings, make_app

from .test_squatter import StepLoop

TOKEN = "handshake-token-5d1c"


@pytest.fixture
async def sidecar(tmp_path):
    runners = []

    async def start(token=TOKEN):
        settings = ServiceSettings(trace_dir=tmp_path / "traces", probe_token=token, http_token=None, max_steps=50,
                                   max_capture_bytes=1 << 30, keep=5, stop_grace_s=1.0)
        runner = web.AppRunner(make_app(settings), shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def get_json(url):
    import aiohttp

    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.json()


async def wait_until(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_probe_and_its_sidecar_authenticate_each_other_and_capture(sidecar, tmp_path, monkeypatch):
    root = tmp_path / "probe-root"
    monkeypatch.setenv("SIDECAR_TOKEN", TOKEN)
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(root))
    url = await sidecar()
    probe = Probe("worker", 0, endpoint=url, cuda_available=False).start()
    try:
        with StepLoop(probe):
            async def registered():
                return len((await get_json(url + "/processes"))[1]["processes"]) == 1
            assert await wait_until(registered), "the probe was not registered"
            status, started = await get_json(url + "/profile/start?steps=3")
            assert status == 202, started

            async def final():
                return (await get_json(url + started["url"]))[1]["state"] in ("done", "partial", "failed")
            assert await wait_until(final, 60)
            _, capture = await get_json(url + started["url"])
    finally:
        await asyncio.to_thread(probe.close)
    assert capture["state"] == "done", capture
    [proc] = capture["processes"]
    assert proc["steps_recorded"] == 3 and proc["file"]
    merged = tmp_path / "traces" / "captures" / capture["id"] / "trace.json.gz"
    events = json.loads(gzip.decompress(merged.read_bytes()))["traceEvents"]
    assert len([e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]) == 3
    # The probe wrote under its own root; the sidecar took the file and left no folder behind.
    assert (root / "captures").is_dir() and list((root / "captures").iterdir()) == []
    assert not (tmp_path / "traces" / "captures" / capture["id"] / "raw").exists()


async def test_a_sidecar_with_another_token_is_refused_by_the_probe(sidecar, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SIDECAR_TOKEN", TOKEN)
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(tmp_path / "probe-root"))
    url = await sidecar(token="another-token")
    probe = Probe("worker", 0, endpoint=url, cuda_available=False)
    with caplog.at_level(logging.DEBUG):
        probe.start()
        try:
            await asyncio.sleep(2.0)  # several tries, with backoff
            _, body = await get_json(url + "/processes")
        finally:
            await asyncio.to_thread(probe.close)
    assert body["processes"] == []
    said = [r.getMessage() for r in caplog.records if r.name == "sidecar.probe.link" and r.levelno >= logging.WARNING]
    assert len(said) == 1 and "did not prove it knows the token" in said[0], said


async def test_a_probe_with_another_token_is_refused_by_the_sidecar(sidecar, monkeypatch, caplog):
    """The probe answers the sidecar's challenge with a proof made with its own token. (A real
    probe stops earlier, at the sidecar's proof: here its check is made to pass, as a probe that
    does not check would.)"""
    from sidecar.common import auth

    monkeypatch.setenv("SIDECAR_TOKEN", "the-probes-token")
    monkeypatch.setattr(auth, "sidecar_proof_ok", lambda *args: True)
    url = await sidecar()
    probe = Probe("worker", 0, endpoint=url, cuda_available=False)
    with caplog.at_level(logging.INFO):
        probe.start()
        try:
            await asyncio.sleep(2.0)
            _, body = await get_json(url + "/processes")
        finally:
            await asyncio.to_thread(probe.close)
    assert body["processes"] == []
    service = [r.getMessage() for r in caplog.records if r.name == "sidecar.service.routes.probe_channel"]
    assert any("refused" in m and "proof" in m for m in service), service
    link = [r.getMessage() for r in caplog.records if r.name == "sidecar.probe.link" and r.levelno >= logging.WARNING]
    assert any("refused this probe" in m and "proof" in m for m in link), link


async def test_without_any_token_the_probe_does_not_connect_and_says_why_once(sidecar, tmp_path, monkeypatch,
                                                                              caplog):
    monkeypatch.delenv("SIDECAR_TOKEN", raising=False)
    monkeypatch.setenv("SIDECAR_TOKEN_FILE", str(tmp_path / "no-such-token"))
    connections = []

    async def handle(request):
        connections.append(request)
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/probe/ws", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    probe = Probe("worker", 0, endpoint=url, cuda_available=False)
    try:
        with caplog.at_level(logging.DEBUG, logger="sidecar.probe.link"):
            probe.start()
            await asyncio.sleep(1.5)
    finally:
        await asyncio.to_thread(probe.close)
        await runner.cleanup()
    assert connections == []
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "no token" in said[0] and "SIDECAR_TOKEN" in said[0], said
