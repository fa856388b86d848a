"""Request-scoped captures on the sidecar's side, with fake probe connections: an ask becomes a capture
bound to its request, answered once every step-driven process is armed, started at once (no lead);
a busy sidecar, processes that do not arm, and released asks are answered or cleaned up and counted;
a capture that ended with its request is done with the steps it recorded."""

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from sidecar.common import auth
from sidecar.common.protocol import (PROBE_WS_PATH, REQUEST_ENDED, Arm, Begin, CaptureReport, Challenge, Hello, Proof,
                              RequestCapture, RequestCaptureAnswer, RequestCaptureRelease, Stop)
from sidecar.common.protocol_codec import PROTOCOL_VERSION, decode_from_sidecar, encode
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.jobs import captures as captures_module
from sidecar.service.jobs.capture_index import from_json
from sidecar.service.metrics.captures import CaptureMetrics
from sidecar.service.export.merge import FinalizeResult, ProcessOutcome
from sidecar.service.jobs.params import CaptureRequest
from sidecar.service.jobs.request_captures import RequestCaptures

from service_fakes import World, identity, sent, until


@pytest.fixture
async def world(tmp_path):
    w = World(tmp_path)
    yield w
    await w.close()


@pytest.fixture
def metrics():
    return CaptureMetrics(CollectorRegistry())


@pytest.fixture
async def asks(world, metrics):
    served = RequestCaptures(world.captures, metrics, max_steps=50, armed_wait_s=0.3)
    yield served
    await served.close()


@pytest.fixture
def fake_merge(monkeypatch):
    def finalize(capture_dir, records, max_bytes):
        done = [r for r in records if r.state == "done"]
        return FinalizeResult(trace_file="trace.json.gz" if done else None, trace_bytes=100 if done else 0,
                              processes={r.stem: ProcessOutcome(file=f"{r.stem}.json.gz", bytes=10) for r in done})

    monkeypatch.setattr(captures_module.merge, "finalize_capture", finalize)


def count(metrics: CaptureMetrics, outcome: str, reason: str) -> float:
    return metrics.request_captures.labels(outcome=outcome, reason=reason)._value.get()


def engine(world):
    return world.connect("api_server"), world.connect("engine_core"), world.connect("worker", 0)


async def test_an_ask_is_answered_once_every_step_driven_process_is_armed(world, asks, metrics):
    api, core, w0 = engine(world)
    w0.step_rate = 500.0  # a fast engine: an ordinary capture would lead by many steps
    asks.on_ask(api, RequestCapture(ask=7, request_id="cmpl-a-0", steps=500))
    await until(lambda: sent(core, Arm))
    capture = world.captures.active
    spec = sent(core, Arm)[0].spec
    assert spec.request_id == "cmpl-a-0" and spec.steps == 50, "bound, and the cap lowered to --max-steps"
    assert capture.bound_request == {"id": "cmpl-a-0", "max_steps": 50, "asked_by": api.identity.label}
    await world.capture_report(core, capture.id, "armed", steps_seen=40)
    await asyncio.sleep(0.05)
    assert not sent(api, RequestCaptureAnswer), "the request waits for every step-driven process"
    await world.capture_report(w0, capture.id, "armed", steps_seen=41)
    await until(lambda: sent(api, RequestCaptureAnswer))
    [answer] = sent(api, RequestCaptureAnswer)
    assert answer == RequestCaptureAnswer(ask=7, capture_id=capture.id, url=f"/profile/{capture.id}")
    # No lead and no delay: the request runs now, its first step may be the next one.
    await until(lambda: sent(w0, Begin))
    assert sent(w0, Begin)[0].start_step == capture.start_step == 41
    assert count(metrics, "armed", "none") == 1
    assert capture.to_json()["request"]["id"] == "cmpl-a-0"


async def test_a_capture_that_ended_with_its_request_is_done_with_the_steps_it_recorded(world, asks, fake_merge):
    api, core, w0 = engine(world)
    asks.on_ask(api, RequestCapture(ask=1, request_id="cmpl-b-0", steps=32))
    await until(lambda: world.captures.active is not None)
    capture = world.captures.active
    for conn in (core, w0):
        await world.capture_report(conn, capture.id, "armed", steps_seen=10)
    await until(lambda: sent(api, RequestCaptureAnswer))
    for conn in (core, w0):
        for state in ("capturing", "exporting", "done"):
            await world.capture_report(conn, capture.id, state, steps_recorded=8, first_step=10,
                                       stop_reason=REQUEST_ENDED, file="/x.json")
    await until(lambda: sent(api, Stop))  # the API server's window ends with the engine's
    for state in ("capturing", "exporting", "done"):
        await world.capture_report(api, capture.id, state, file="/y.json")
    await asyncio.wait_for(capture.done_event.wait(), 5)
    assert (capture.state, capture.reason) == ("done", None)
    body = capture.to_json()
    assert body["steps"] == 8 and body["request"]["max_steps"] == 32


async def test_a_capture_that_stopped_for_another_reason_is_partial(world, asks, fake_merge):
    api, core, w0 = engine(world)
    asks.on_ask(api, RequestCapture(ask=1, request_id="cmpl-c-0", steps=32))
    await until(lambda: world.captures.active is not None)
    capture = world.captures.active
    for conn in (core, w0):
        await world.capture_report(conn, capture.id, "armed", steps_seen=10)
    for conn in (core, w0):
        for state in ("capturing", "exporting", "done"):
            await world.capture_report(conn, capture.id, state, steps_recorded=5, first_step=10,
                                       stop_reason="sidecar disconnected", file="/x.json")
    for state in ("capturing", "exporting", "done"):
        await world.capture_report(api, capture.id, state, file="/y.json")
    await asyncio.wait_for(capture.done_event.wait(), 5)
    assert capture.state == "partial" and "recorded 5 of 32 steps" in capture.reason


async def test_a_second_ask_while_a_job_runs_is_skipped_busy(world, asks, metrics):
    api, core, w0 = engine(world)
    running = await world.captures.start(CaptureRequest(steps=5))
    asks.on_ask(api, RequestCapture(ask=2, request_id="cmpl-d-0", steps=32))
    await until(lambda: sent(api, RequestCaptureAnswer))
    [answer] = sent(api, RequestCaptureAnswer)
    assert answer.capture_id is None and answer.skipped.startswith(f"busy: capture {running.id}")
    assert world.captures.active is running
    assert count(metrics, "skipped", "busy") == 1 and count(metrics, "armed", "none") == 0


async def test_no_engine_process_is_skipped_and_counted(world, asks, metrics):
    api = world.connect("api_server")
    asks.on_ask(api, RequestCapture(ask=3, request_id="cmpl-e-0", steps=32))
    await until(lambda: sent(api, RequestCaptureAnswer))
    assert "no engine core or worker" in sent(api, RequestCaptureAnswer)[0].skipped
    assert count(metrics, "skipped", "refused") == 1


async def test_processes_that_do_not_arm_in_time_send_the_request_on_uncaptured(world, asks, metrics):
    api, core, w0 = engine(world)
    asks.on_ask(api, RequestCapture(ask=4, request_id="cmpl-f-0", steps=32))
    await until(lambda: world.captures.active is not None)
    capture = world.captures.active
    await world.capture_report(core, capture.id, "armed", steps_seen=3)  # the worker never answers
    await until(lambda: sent(api, RequestCaptureAnswer), timeout=2)
    [answer] = sent(api, RequestCaptureAnswer)
    assert answer.capture_id is None and "not armed in every process" in answer.skipped
    assert w0.identity.label in answer.skipped
    assert sent(core, Stop), "the capture it started is stopped"
    assert count(metrics, "skipped", "not_armed") == 1


async def test_a_released_ask_stops_its_capture_and_is_not_answered(world, asks, metrics):
    api, core, w0 = engine(world)
    asks.on_ask(api, RequestCapture(ask=5, request_id="cmpl-g-0", steps=32))
    await until(lambda: world.captures.active is not None)
    capture = world.captures.active
    await asks.on_release(api, RequestCaptureRelease(ask=5, reason="the request went on"))
    [stop] = sent(core, Stop)
    assert stop.job_id == capture.id and "released: the request went on" in stop.reason
    await asyncio.sleep(0.4)
    assert not sent(api, RequestCaptureAnswer)
    assert count(metrics, "skipped", "released") == 1
    # A release of an ask already answered, or of another connection's, changes nothing more.
    await asks.on_release(api, RequestCaptureRelease(ask=5))
    await asks.on_release(core, RequestCaptureRelease(ask=99))
    assert len(sent(core, Stop)) == 1


async def test_a_release_after_the_answer_stops_the_capture(world, asks, metrics):
    api, core, w0 = engine(world)
    asks.on_ask(api, RequestCapture(ask=6, request_id="cmpl-h-0", steps=32))
    await until(lambda: world.captures.active is not None)
    capture = world.captures.active
    for conn in (core, w0):
        await world.capture_report(conn, capture.id, "armed", steps_seen=1)
    await until(lambda: sent(api, RequestCaptureAnswer))
    await asks.on_release(api, RequestCaptureRelease(ask=6, reason="cancelled"))
    assert sent(w0, Stop) and capture.stop_reason == "released: cancelled"
    assert count(metrics, "armed", "none") == 1 and count(metrics, "skipped", "released") == 0


# -- over the real probe channel ----------------------------------------------------------------------
TOKEN = "probe-token"


async def test_an_ask_over_the_probe_channel_is_answered_and_counted_on_metrics(aiohttp_client, tmp_path):
    settings = ServiceSettings(trace_dir=tmp_path / "traces", probe_token=TOKEN, http_token=None, max_steps=50,
                               max_capture_bytes=1 << 30, keep=20, stop_grace_s=1.0)
    client = await aiohttp_client(make_app(settings))

    async def connect(role, rank=None):
        ws = await client.ws_connect(PROBE_WS_PATH)
        nonce = auth.new_nonce()
        await ws.send_str(encode(Hello(protocol=PROTOCOL_VERSION, process=identity(role, rank), nonce=nonce)))
        challenge = decode_from_sidecar((await ws.receive(timeout=5)).data)
        assert isinstance(challenge, Challenge)
        await ws.send_str(encode(Proof(proof=auth.probe_proof(TOKEN, challenge.nonce, nonce))))
        return ws

    async def receive(ws, kind):
        while True:
            msg = decode_from_sidecar((await ws.receive(timeout=5)).data)
            if isinstance(msg, kind):
                return msg

    api, core, worker = await connect("api_server"), await connect("engine_core"), await connect("worker", 0)
    for _ in range(200):
        if len((await (await client.get("/processes")).json())["processes"]) == 3:
            break
        await asyncio.sleep(0.02)
    await api.send_str(encode(RequestCapture(ask=1, request_id="cmpl-z-0", steps=32)))
    for ws in (core, worker):
        arm = await receive(ws, Arm)
        assert arm.spec.request_id == "cmpl-z-0"
        await ws.send_str(encode(CaptureReport(job_id=arm.spec.id, state="armed", steps_seen=5)))
    answer = await receive(api, RequestCaptureAnswer)
    assert answer.capture_id == arm.spec.id and answer.url == f"/profile/{arm.spec.id}"
    status = await (await client.get(f"/profile/{arm.spec.id}")).json()
    assert status["request"] == {"id": "cmpl-z-0", "max_steps": 32, "asked_by": status["processes"][0]["label"]}
    await api.send_str(encode(RequestCapture(ask=2, request_id="cmpl-y-0", steps=32)))
    assert (await receive(api, RequestCaptureAnswer)).skipped.startswith(f"busy: capture {arm.spec.id}")
    metrics = await (await client.get("/metrics")).text()
    assert 'sidecar_request_captures_total{outcome="armed",reason="none"} 1.0' in metrics
    assert 'sidecar_request_captures_total{outcome="skipped",reason="busy"} 1.0' in metrics
    assert 'sidecar_request_captures_total{outcome="skipped",reason="not_armed"} 0.0' in metrics
    for ws in (api, core, worker):
        await ws.close()


def test_the_bound_request_is_read_back_after_a_restart(tmp_path):
    folder = tmp_path / "20261123-085748-53f178"
    folder.mkdir()
    data = {"id": folder.name, "state": "done", "steps": 8, "options": {},
            "request": {"id": "cmpl-a-0", "max_steps": 32, "asked_by": "API server (pid 1)"}}
    restored = from_json(folder, data, interrupted=False)
    assert restored.to_json()["request"] == data["request"]
    assert from_json(folder, {**data, "request": "junk"}, interrupted=False).bound_request is None
