"""What the probe's tests share: a real sidecar (the service's own app) on a free local port, for
the tests of a probe's link against the real thing rather than a stand-in."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from aiohttp import web

from sidecar.service.app import ServiceSettings, make_app


@dataclass(frozen=True)
class RealSidecar:
    url: str  # its base URL: http://127.0.0.1:<free port>
    probe_token: str  # what a probe's token_provider gives to be let in


@pytest.fixture
async def real_sidecar(tmp_path):
    """The sidecar's app served on 127.0.0.1 (trace dir under ``tmp_path``, no HTTP token), cleaned
    up after the test."""
    token = "t"
    app = make_app(ServiceSettings(trace_dir=tmp_path / "traces", probe_token=token, http_token=None,
                                   max_steps=50, max_capture_bytes=1 << 30, keep=5))
    runner = web.AppRunner(app, shutdown_timeout=1.0)  # a link closed mid-connection is not waited for
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield RealSidecar(url=f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}", probe_token=token)
    finally:
        await runner.cleanup()
