"""A port squatter: any local process listening where the probes look for their sidecar, while the
sidecar is down. It records every header and frame it gets, answers the hello with a proof it cannot
have made, then sends ``arm`` and ``begin`` naming a directory of its choosing. A real probe, taking
steps, must give it nothing: no token, nothing after its hello, no file written anywhere; a metric push
to it must carry no token either."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest
import torch
from aiohttp import WSMsgType, web

from sidecar.probe import Probe
from sidecar.common.protocol import METRICS_PUSH_PATH, PROBE_WS_PATH

TOKEN = "squatted-secret-7f3a9c1e"
SQUAT_S = 3.0  # long enough for a probe to record a few steps and to send a heartbeat (every 2 s)


class Squatter:
    """Not a sidecar: an aiohttp server that keeps what it is sent and commands what it can."""

    def __init__(self, target_dir, job_id: str) -> None:
        self.target_dir = target_dir
        self.job_id = job_id
        self.headers: list[dict[str, str]] = []
        self.connections: list[list[str]] = []  # the frames of each websocket connection, in order
        self.pushes: list[bytes] = []

    async def probe_ws(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        frames: list[str] = []
        self.connections.append(frames)
        try:
            first = await ws.receive(timeout=5)
        except asyncio.TimeoutError:
            return ws
        if first.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return ws
        frames.append(first.data)
        # A challenge with a proof made without the token, then commands.
        await ws.send_str(json.dumps({"type": "challenge", "nonce": "ab" * 32, "proof": "00" * 32}))
        spec = {"id": self.job_id, "steps": 3, "out_dir": str(self.target_dir)}
        await ws.send_str(json.dumps({"type": "arm", "spec": spec}))
        await ws.send_str(json.dumps({"type": "sync_arm", "spec": {"id": "s" + self.job_id, "steps": 3}}))
        await ws.send_str(json.dumps({"type": "begin", "job_id": self.job_id, "start_step": 0}))
        deadline = time.monotonic() + SQUAT_S
        while not ws.closed and time.monotonic() < deadline:
            try:
                msg = await ws.receive(timeout=max(0.05, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                frames.append(msg.data)
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
        return ws

    async def push(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        self.pushes.append(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    def everything_received(self) -> str:
        parts = [f"{k}: {v}" for h in self.headers for k, v in h.items()]
        parts += [f if isinstance(f, str) else f.decode("latin-1") for c in self.connections for f in c]
        parts += [p.decode("latin-1") for p in self.pushes]
        return "\n".join(parts)


@pytest.fixture
async def squat():
    runners = []

    async def start(target_dir, job_id="c1"):
        squatter = Squatter(target_dir, job_id)
        app = web.Application()
        app.router.add_get(PROBE_WS_PATH, squatter.probe_ws)
        app.router.add_post(METRICS_PUSH_PATH, squatter.push)
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return squatter, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


class StepLoop:
    """An engine's step thread: the probe sees a working step every few milliseconds."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        x = torch.randn(16, 16)
        while not self._stop.is_set():
            self.probe.step_begin(True)
            (x @ x).sum()
            self.probe.step_end(True)
            time.sleep(0.005)

    def __enter__(self) -> "StepLoop":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.mark.parametrize("job_id", ["c1", ".."])
async def test_a_squatter_gets_no_token_no_report_and_no_file(squat, tmp_path, monkeypatch, caplog, job_id):
    target = tmp_path / "squatters-choice"
    target.mkdir()
    root = tmp_path / "probe-root"
    monkeypatch.setenv("SIDECAR_TOKEN", TOKEN)
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(root))
    squatter, url = await squat(target, job_id)
    probe = Probe("worker", 0, endpoint=url, cuda_available=False)
    with caplog.at_level(logging.DEBUG, logger="sidecar.probe.link"):
        probe.start()
        try:
            with StepLoop(probe):
                started = time.monotonic()
                while time.monotonic() - started < SQUAT_S + 0.5 or len(squatter.connections) < 2:
                    await asyncio.sleep(0.1)
                    assert time.monotonic() - started < 30, "the probe did not reconnect"
        finally:
            await asyncio.to_thread(probe.close)

    assert probe.steps > 50, "the engine took steps all along"
    assert squatter.connections, "the probe connected"
    received = squatter.everything_received()
    assert TOKEN not in received, "the token reached the squatter"
    assert all(TOKEN not in v for h in squatter.headers for v in h.values())
    assert not any(k.lower() == "authorization" for h in squatter.headers for k in h)
    for frames in squatter.connections:  # on every connection: its hello, and nothing after it
        assert len(frames) == 1, frames
        hello = json.loads(frames[0])
        assert hello["type"] == "hello" and len(hello["nonce"]) == 64
    assert list(target.rglob("*")) == [], "a file was written where the squatter asked"
    assert not root.exists() or [p for p in root.rglob("*") if p.is_file()] == [], "a trace was written"
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING and "did not prove" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert url + PROBE_WS_PATH in warned[0].getMessage() and "squatter" in warned[0].getMessage()


async def test_a_metric_push_to_a_squatter_carries_no_token(squat, tmp_path, monkeypatch):
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    from sidecar.telemetry.push import SidecarMetricExporter

    monkeypatch.setenv("SIDECAR_TOKEN", TOKEN)
    squatter, url = await squat(tmp_path)
    exporter = SidecarMetricExporter(url + METRICS_PUSH_PATH)  # the token from the environment, as in an engine
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = MeterProvider(metric_readers=[reader])
    provider.get_meter("test").create_counter("requests").add(3)
    try:
        await asyncio.to_thread(reader.force_flush)
    finally:
        await asyncio.to_thread(provider.shutdown)
    assert exporter.pushes >= 1 and squatter.pushes
    assert TOKEN not in squatter.everything_received()
    assert not any(k.lower() == "authorization" for h in squatter.headers for k in h)
    assert all("X-Sidecar-Signature" in h and "X-Sidecar-Timestamp" in h for h in squatter.headers)
