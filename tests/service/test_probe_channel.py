"""The probe channel and the HTTP routes over real sockets, with a probe written here in a few lines of
the typed protocol (no engine process): hello and version checks, malformed frames, heartbeats,
roles that are data, and a whole capture whose JSON and capture.json are the documented ones."""

import asyncio
import json

import pytest
from aiohttp import WSMsgType

from sidecar.common import auth
from sidecar.common.protocol import (PROBE_WS_PATH, Arm, Begin, CaptureReport, Challenge, Heartbeat, Hello, Proof, Stop,
                              Verdict, ClockProbe)
from sidecar.common.protocol_codec import PROTOCOL_VERSION, decode_from_sidecar, encode
from sidecar.service.app import ServiceSettings, make_app
from sidecar.common.verdicts import FINAL

from sidecar.probe.capture.trace_root import TraceRoot
from service_fakes import identity

TOKEN = "probe-token"


@pytest.fixture
async def client(aiohttp_client, tmp_path):
    settings = ServiceSettings(trace_dir=tmp_path / "traces", probe_token=TOKEN, http_token=None, max_steps=50,
                               max_capture_bytes=1 << 30, keep=20, stop_grace_s=1.0)
    return await aiohttp_client(make_app(settings))


class Probe:
    def __init__(self, ws, ident):
        self.ws, self.identity = ws, ident

    async def send(self, msg):
        await self.ws.send_str(encode(msg))

    async def receive(self, kind):
        while True:  # clock probes come at any time (the sidecar's clock estimate): not what is tested here
            msg = decode_from_sidecar((await self.ws.receive(timeout=5)).data)
            if not isinstance(msg, ClockProbe):
                break
        assert isinstance(msg, kind), msg
        return msg


async def connect(client, role, rank=None, files_at=None, **kwargs):
    """A probe through the handshake: its hello, the sidecar's challenge checked, its proof. With
    ``files_at``, its trace root there and its marker in it: the sidecar reads its files there."""
    ident = identity(role, rank, **kwargs)
    ws = await client.ws_connect(PROBE_WS_PATH)
    nonce = auth.new_nonce()
    marker = TraceRoot(files_at).make_marker() if files_at is not None else ""
    await ws.send_str(encode(Hello(protocol=PROTOCOL_VERSION, process=ident, nonce=nonce,
                                   files_at=str(files_at or ""), marker=marker)))
    challenge = decode_from_sidecar((await ws.receive(timeout=5)).data)
    assert isinstance(challenge, Challenge) and auth.sidecar_proof_ok(TOKEN, nonce, challenge.nonce, challenge.proof)
    await ws.send_str(encode(Proof(proof=auth.probe_proof(TOKEN, challenge.nonce, nonce))))
    return Probe(ws, ident)


async def processes(client, count):
    for _ in range(200):
        body = await (await client.get("/processes")).json()
        if len(body["processes"]) >= count:
            return body["processes"]
        await asyncio.sleep(0.02)
    raise AssertionError(body)


async def test_a_probe_of_another_version_is_refused_naming_both(client, caplog):
    ws = await client.ws_connect(PROBE_WS_PATH)
    await ws.send_str(json.dumps({"type": "hello", "protocol": 1, "role": "worker", "pid": 5}))
    msg = await ws.receive(timeout=5)
    assert msg.type == WSMsgType.CLOSE and msg.data == 4400
    assert "protocol 1," in msg.extra and f"speaks {PROTOCOL_VERSION}" in msg.extra
    assert len(msg.extra.encode()) <= 123
    assert any("protocol 1," in r.getMessage() and f"speaks {PROTOCOL_VERSION}" in r.getMessage() for r in caplog.records)
    assert (await (await client.get("/processes")).json())["processes"] == []


@pytest.mark.parametrize("frame", [
    "not json",
    json.dumps({"type": "heartbeat", "steps": 1}),
    json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "process": {"role": "Worker!", "pid": 1}}),
])
async def test_other_bad_hellos_are_refused(client, frame):
    ws = await client.ws_connect(PROBE_WS_PATH)
    await ws.send_str(frame)
    msg = await ws.receive(timeout=5)
    assert msg.type == WSMsgType.CLOSE and msg.data == 4400
    assert msg.extra.startswith("bad hello")


async def test_malformed_frames_are_dropped_and_the_connection_goes_on(client, caplog):
    probe = await connect(client, "worker", 0)
    await processes(client, 1)
    await probe.ws.send_str(json.dumps({"type": "heartbeat", "steps": -4}))
    await probe.ws.send_str(json.dumps({"type": "capture", "job_id": "x", "state": "bogus"}))
    await probe.ws.send_str("{")
    await probe.send(Heartbeat(steps=12, sync_watch={"state": "watching", "every": 16, "sites": []}))
    for _ in range(100):
        [proc] = (await (await client.get("/processes")).json())["processes"]
        if proc["last_step"] == 12:
            break
        await asyncio.sleep(0.02)
    assert proc["last_step"] == 12
    watch = await (await client.get("/syncs/watch")).json()
    assert watch["processes"] == [{"state": "watching", "every": 16, "process": probe.identity.label}]
    dropped = [r for r in caplog.records if "message dropped" in r.getMessage()]
    assert len([r for r in dropped if r.levelname == "WARNING"]) == 1, "warned once per connection"


async def test_roles_are_data_listing_order_and_the_processes_filter(client):
    await connect(client, "worker", 1)
    await connect(client, "scheduler", 0, step_driven=True, label="scheduler")
    await connect(client, "api_server")
    await connect(client, "engine_core")
    procs = await processes(client, 4)
    assert [(p["role"], p["rank"]) for p in procs] == [
        ("api_server", None), ("engine_core", None), ("scheduler", 0), ("worker", 1)]
    assert procs[2]["label"].startswith("scheduler rank 0 (pid ") and procs[2]["engine"] == "fake 1.0"
    assert set(procs[0]) == {"role", "pid", "rank", "label", "host", "cuda", "engine", "last_step", "step_rate",
                             "connected_at", "last_seen", "open_step_ms", "stuck", "clock", "files_shared",
                             "instance"}
    resp = await client.get("/profile/start", params={"steps": "1", "processes": "gpu"})
    body = await resp.json()
    assert resp.status == 400 and body["param"] == "processes" and body["error"] == "bad_parameter"
    assert "api_server, engine_core, worker, scheduler" in body["message"]
    resp = await client.get("/sync/start", params={"steps": "1", "processes": "scheduler"})
    assert resp.status == 202, await resp.text()
    assert (await resp.json())["processes"][0].startswith("scheduler rank 0")
    busy = await client.get("/profile/start", params={"steps": "1"})
    assert busy.status == 409 and (await busy.json())["error"] == "scan_in_progress"


async def test_a_whole_capture_over_the_channel(client, tmp_path):
    core = await connect(client, "engine_core", files_at=tmp_path / "probe-root")
    worker = await connect(client, "worker", 0, files_at=tmp_path / "probe-root")
    await processes(client, 2)
    resp = await client.post("/profile/start", json={"steps": 1, "delay": 2, "with_stack": True})
    assert resp.status == 202
    started = await resp.json()
    capture_id = started["id"]
    assert started == {"id": capture_id, "state": "armed", "url": f"/profile/{capture_id}",
                       "processes": [core.identity.label, worker.identity.label]}
    busy = await client.get("/sync/start", params={"steps": "1"})
    assert busy.status == 409 and (await busy.json()) == {
        "error": "capture_in_progress", "active": capture_id,
        "message": f"capture {capture_id} is armed; wait for it or POST /profile/stop"}

    for probe in (core, worker):
        arm = await probe.receive(Arm)
        assert arm.spec.stacks == "sampled" and arm.spec.stack_hz == 1000 and arm.spec.steps == 1
        await probe.send(CaptureReport(job_id=capture_id, state="armed", steps_seen=10))
    for probe in (core, worker):
        begin = await probe.receive(Begin)
        assert begin.start_step == 10 + 2 + 2
        # Where a probe writes: <its trace root>/captures/<id>/raw/<stem>.json (here: another root).
        raw_dir = tmp_path / "probe-root" / "captures" / capture_id / "raw"
        raw_dir.mkdir(parents=True, exist_ok=True)
        raw = str(raw_dir / f"{probe.identity.file_stem}.json")
        trace = {"schemaVersion": 1, "baseTimeNanoseconds": 1_000_000_000, "traceEvents": [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": probe.identity.pid, "tid": 1,
             "ts": 10.0, "dur": 5.0}]}
        with open(raw, "w") as fh:
            json.dump(trace, fh)
        for state in ("capturing", "exporting"):
            await probe.send(CaptureReport(job_id=capture_id, state=state, steps_recorded=1, first_step=14))
        cut = "max_bytes reached" if probe is worker else None
        await probe.send(CaptureReport(job_id=capture_id, state="done", steps_recorded=1, first_step=14,
                                       file=raw, bytes=100, stacks="sampled",
                                       stack_summary={"samples": 7, "stop_reason": cut, "top_self": []}))
    for _ in range(500):
        status = await (await client.get(f"/profile/{capture_id}")).json()
        if status["state"] in ("done", "partial", "failed"):
            break
        await asyncio.sleep(0.02)
    assert status["state"] == "done", status
    assert list(status) == ["id", "state", "reason", "notes", "steps", "start_step", "start_steps", "delay", "created_at",
                            "finished_at", "headline", "trace", "trace_bytes", "summary", "processes", "trigger",
                            "alert", "request", "fleet", "backend", "nsys", "stored", "files", "options"]
    assert status["trace"] == f"/profile/{capture_id}/trace" and status["start_step"] == 14 and status["delay"] == 2
    stem = worker.identity.file_stem
    assert status["files"][f"{stem}.pt.trace.json.gz"] == f"/profile/{capture_id}/files/{stem}.pt.trace.json.gz"
    assert status["options"] == {"activities": "host default", "record_shapes": False, "with_stack": True,
                                 "stacks": "sampled", "stack_hz": 1000.0,
                                 "profile_memory": False, "with_flops": False, "with_modules": False, "timeout_s": 120.0,
                                 "processes": "all", "instance": None, "backend": "torch"}
    assert list(status["processes"][0]) == ["role", "pid", "rank", "label", "instance", "state", "steps_recorded",
                                            "first_step",
                                            "file", "bytes", "error", "stacks", "stack_summary", "step_thread_ms",
                                            "export_ms", "clock", "nsys"]
    assert [p["stack_summary"]["samples"] for p in status["processes"]] == [7, 7]
    # The sampler's own bound cut the worker's stacks short: a note says so; the capture is done.
    assert any(n.startswith(f"{worker.identity.label}: python stacks stopped early (max_bytes reached)")
               for n in status["notes"]), status["notes"]
    # Each process is told the verdict over its channel (the API server's capture span needs it; no
    # token has to go to the HTTP API for it).
    for probe in (core, worker):
        told = await probe.receive(Verdict)
        assert (told.job_id, told.state, told.steps, told.processes, told.trace_bytes, told.trace, told.started_by) == (
            capture_id, "done", 1, 2, status["trace_bytes"], f"/profile/{capture_id}/trace", None)
    saved = (tmp_path / "traces" / "captures" / capture_id / "capture.json").read_text()
    assert saved == json.dumps(status, indent=1), "capture.json holds what GET /profile/{id} serves"
    assert (await client.get(status["trace"])).status == 200
    listed = await (await client.get("/profiles")).json()
    assert listed == {"captures": [status]}
    health = await (await client.get("/healthz")).json()
    assert health["active_capture"] is None and health["processes"] == 2

    # Stop with nothing running; and a probe that leaves mid-capture is lost.
    assert (await client.post("/profile/stop")).status == 409
    second = (await (await client.get("/profile/start", params={"steps": "1"})).json())["id"]
    assert (await (await client.get("/healthz")).json())["active_capture"] == second
    await core.receive(Arm)
    await worker.receive(Arm)
    await worker.ws.close()
    stopped = await client.post("/profile/stop")
    assert (await stopped.json())["id"] == second
    assert (await core.receive(Stop)).reason == "stopped by request"
    await core.send(CaptureReport(job_id=second, state="failed", error="no step recorded before the capture ended"))
    for _ in range(500):
        status = await (await client.get(f"/profile/{second}")).json()
        if status["state"] in FINAL:
            break
        await asyncio.sleep(0.02)
    assert status["state"] == "cancelled" and status["reason"] == "cancelled by the user before any step was recorded"
    lost = next(p for p in status["processes"] if p["role"] == "worker")
    assert lost["state"] == "lost" and lost["error"] == "probe disconnected during the capture"
