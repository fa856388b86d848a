"""``sidecar.instrument``: the public API for a hand-written serving loop (docs/engine-api.md).

Spans and metrics go to in-memory telemetry here (tests/telemetry/helpers.py); the probe is real, with
no sidecar behind it (its link thread retries in the background) or, in the last test, with the real
sidecar app on a real socket: a capture of the single-process shape and the requests in flight.
tests/e2e/test_example_server.py runs the example server in its own process against the sidecar's CLI.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import threading
import time

import pytest
from opentelemetry.trace import SpanKind, StatusCode

import sidecar
from sidecar.engine import GENERIC, SCHEDULER, EngineProfile
from sidecar.instrumentation import Instrumentation, Step
from sidecar.integration.attach import PROBE_ATTR
from sidecar.common.verdicts import FINAL
from telemetry.helpers import in_memory_telemetry, metric_points

NO_SIDECAR = "http://127.0.0.1:9"  # nothing listens: the probe's link thread retries quietly
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def make(monkeypatch, tmp_path):
    monkeypatch.setenv("SIDECAR_TOKEN_FILE", str(tmp_path / "no-token"))
    monkeypatch.setenv("SIDECAR_ENDPOINT", NO_SIDECAR)  # metric pushes too: never a sidecar of the host's
    made = []

    def build(engine="loop", **kwargs) -> Instrumentation:
        kwargs.setdefault("endpoint", NO_SIDECAR)
        kwargs.setdefault("cuda_available", False)
        inst = sidecar.instrument(engine, **kwargs)
        made.append(inst)
        return inst

    yield build
    for inst in made:
        inst.close()


def test_the_package_exports_the_api_lazily():
    assert sidecar.instrument is sidecar.instrumentation.instrument
    assert sidecar.Instrumentation is Instrumentation and sidecar.SCHEDULER is SCHEDULER
    assert {"instrument", "Instrumentation", "Step", "EngineProfile", "PhaseRule", "AllowEntry"} <= set(sidecar.__all__)
    with pytest.raises(AttributeError):
        sidecar.no_such_name  # noqa: B018


def test_a_name_makes_a_single_process_engine_with_one_step_driven_role(make):
    inst = make("myengine", model="m")
    assert inst.profile.name == "myengine" and inst.profile.roles == (SCHEDULER,)
    assert inst.profile.service_name == "myengine" and inst.role is SCHEDULER and inst.rank is None
    assert inst.enabled and inst.probe is not None and inst.probe.identity.step_driven
    assert inst.probe.identity.role == "scheduler" and inst.probe.identity.engine == "myengine"
    assert inst.__dict__[PROBE_ATTR] is inst.probe  # through sidecar.integration.attach, once
    # A step-driven process that also serves requests keeps them in its flight recorder.
    assert inst.probe.ring is not None and inst.probe.request_ring is not None


def test_a_profile_and_a_role_of_it(make):
    inst = make(GENERIC, role="worker", rank=3)
    assert inst.role.name == "worker" and inst.probe.identity.rank == 3
    assert make(GENERIC).role.name == "engine_core"  # default: the profile's first step-driven role


def test_wrong_arguments_raise_at_setup_not_in_serving(make):
    with pytest.raises(ValueError, match="no role 'api'"):
        make(GENERIC, role="api")
    with pytest.raises(ValueError, match="non-empty name"):
        make("")
    with pytest.raises(TypeError, match="'trace_rot'"):
        make("loop", trace_rot="/tmp")


def test_disabled_builds_nothing_and_every_call_is_a_no_op(make, monkeypatch):
    monkeypatch.setenv("SIDECAR_DISABLE", "1")
    threads = threading.active_count()
    inst = make("loop")
    assert not inst.enabled and inst.probe is None and inst.telemetry is None
    with inst.step(True) as step:
        step.batch = 2
    inst.request_started("r1", input_tokens=3)
    inst.request_scheduled("r1")
    inst.request_first_token("r1")
    assert inst.request_finished("r1", output_tokens=1) is None
    assert inst.requests_in_flight() == [] and threading.active_count() <= threads  # no probe, no samplers
    # The step path, disabled: two attribute reads per call. Loose bound, a busy host included.
    t0 = time.perf_counter()
    for _ in range(10_000):
        with inst.step(True):
            pass
    assert (time.perf_counter() - t0) / 10_000 < 50e-6


def test_steps_feed_the_probe_the_flight_recorder_and_the_step_metrics(make):
    telemetry, _, reader = in_memory_telemetry()
    inst = make("loop", telemetry=telemetry)
    for n in range(3):
        with inst.step(has_work=True) as step:
            step.batch, step.tokens, step.running, step.waiting = 2, 10 + n, 2, 1
    with inst.step(has_work=False):  # an idle pass: no working step, no step metrics
        pass
    with inst.step(has_work=True) as step:
        step.did_work = False  # announced work, did none
    assert inst.probe.steps == 3
    rows = inst.probe.recorder_dump()["steps"]["steps"]
    assert rows["step"] == [1, 2, 3, 3, 3] and rows["working"] == [1, 1, 1, 0, 0]
    assert rows["batch"][:3] == [2, 2, 2] and rows["tokens"][:3] == [10, 11, 12] and rows["waiting"][:3] == [1, 1, 1]
    telemetry.run_tasks_once()  # the sampler thread's drain, now
    [point] = metric_points(reader, "sidecar.step.duration")
    assert point.count == 3 and point.attributes == {"sidecar.process.role": "scheduler"}
    assert [p.sum for p in metric_points(reader, "sidecar.step.tokens")] == [33]


def test_an_exception_in_a_step_ends_the_step_and_reaches_the_caller(make):
    inst = make("loop")
    with pytest.raises(RuntimeError, match="model failed"):
        with inst.step(True):
            raise RuntimeError("model failed")
    assert inst.probe.steps == 1 and inst.probe.ring.open_since_ns == 0  # the step was closed


def test_a_failure_inside_is_logged_once_and_never_reaches_the_loop(make, caplog):
    inst = make("loop")

    def broken(*args):
        raise OSError("probe broke")

    inst.probe.step_begin = broken
    inst.probe.step_end = broken
    with caplog.at_level(logging.WARNING, logger="sidecar.instrumentation"):
        for _ in range(3):
            with inst.step(True) as step:
                step.batch = 1
        inst.request_started(["unhashable"])
        inst.request_scheduled(["unhashable"])
        inst.request_first_token(["unhashable"])
        assert inst.request_finished(["unhashable"]) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert sum("step_begin failed" in w for w in warnings) == 1 and sum("step_end failed" in w for w in warnings) == 1
    assert any("request_started failed" in w for w in warnings)


def test_a_request_becomes_a_span_tree_metrics_and_a_flight_recorder_row(make):
    telemetry, exporter, reader = in_memory_telemetry()
    inst = make("loop", model="tiny", telemetry=telemetry)
    inst.request_started("cmpl-1", input_tokens=5, max_tokens=4, temperature=0.5,
                         trace_headers={"Traceparent": TRACEPARENT, "Authorization": "Bearer x"})
    assert [(r["id"], r["phase"], r["prompt_tokens"]) for r in inst.requests_in_flight()] == [("cmpl-1", "queued", 5)]
    time.sleep(0.01)
    inst.request_scheduled("cmpl-1")
    assert inst.requests_in_flight()[0]["phase"] == "prefill"
    time.sleep(0.01)
    inst.request_first_token("cmpl-1")
    inst.request_first_token("cmpl-1")  # only the first counts
    assert inst.requests_in_flight()[0]["phase"] == "decode"
    time.sleep(0.01)
    context = inst.request_finished("cmpl-1", output_tokens=4, finish_reason="length")
    assert inst.requests_in_flight() == []
    telemetry.span_processor.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"text_completion tiny", "queue", "prefill", "decode"}
    root = spans["text_completion tiny"]
    assert root.kind == SpanKind.SERVER and root.context.span_id == context.span_id
    assert f"{root.context.trace_id:032x}" == TRACEPARENT.split("-")[1]  # the caller's trace
    attrs = root.attributes
    assert attrs["gen_ai.usage.input_tokens"] == 5 and attrs["gen_ai.usage.output_tokens"] == 4
    assert attrs["gen_ai.request.max_tokens"] == 4 and attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.response.finish_reasons"] == ("length",) and "gen_ai.provider.name" not in attrs
    ttft = attrs["gen_ai.response.time_to_first_chunk"]
    assert 0.02 <= ttft < 1.0
    queue, prefill, decode = spans["queue"], spans["prefill"], spans["decode"]
    assert root.start_time <= queue.start_time <= queue.end_time <= prefill.start_time + 1000
    assert prefill.end_time <= decode.start_time + 1000 and decode.end_time <= root.end_time
    assert 0.01 <= (queue.end_time - queue.start_time) / 1e9 < 1.0
    [point] = metric_points(reader, "gen_ai.server.time_to_first_token")
    assert point.count == 1 and abs(point.sum - ttft) < 1e-9
    assert dict(point.attributes) == {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": "tiny"}
    [queued] = metric_points(reader, "sidecar.request.queue_time")
    assert queued.count == 1
    requests = inst.probe.recorder_dump()["requests"]
    assert requests["id"] == ["cmpl-1"] and requests["outcome"] == ["finished"]
    assert requests["prompt_tokens"] == [5] and requests["output_tokens"] == [4]
    assert requests["first_token_ns"][0] - requests["arrived_ns"][0] == pytest.approx(ttft * 1e9, abs=2000)


def test_an_aborted_request_is_an_error_span_without_ttft(make):
    telemetry, exporter, reader = in_memory_telemetry()
    inst = make("loop", model="tiny", telemetry=telemetry)
    inst.request_started("cmpl-2", input_tokens=3)
    inst.request_scheduled("cmpl-2")
    inst.request_first_token("cmpl-2")
    inst.request_finished("cmpl-2", output_tokens=1, finish_reason="abort")
    assert inst.request_finished("never-started") is None
    telemetry.span_processor.force_flush()
    [root] = [s for s in exporter.get_finished_spans() if s.name == "text_completion tiny"]
    assert root.status.status_code == StatusCode.ERROR and root.attributes["error.type"] == "aborted"
    assert metric_points(reader, "gen_ai.server.time_to_first_token") == []
    assert inst.probe.recorder_dump()["requests"]["outcome"] == ["aborted"]


def test_record_finished_takes_a_request_an_integration_built(make):
    from sidecar.telemetry import FinishedRequest

    telemetry, exporter, _ = in_memory_telemetry()
    profile = EngineProfile(name="custom", roles=(SCHEDULER,), provider="custom")
    inst = make(profile, telemetry=telemetry)
    now = time.time()
    inst.record_finished(FinishedRequest(request_id="x", model="m", operation="chat", finish_reason="stop",
                                         arrival_time=now - 1, finished_time=now, time_to_first_token=0.2,
                                         input_tokens=1, output_tokens=1))
    telemetry.span_processor.force_flush()
    [span] = exporter.get_finished_spans()
    assert span.name == "chat m" and span.attributes["gen_ai.provider.name"] == "custom"


async def test_a_window_role_records_on_the_running_loop_and_takes_no_steps(make):
    inst = make(GENERIC, role="api_server")
    assert inst.probe._loop is asyncio.get_running_loop() and not inst.probe.identity.step_driven
    with inst.step(True):
        pass
    assert inst.probe.steps == 0 and inst.probe.ring is None


def test_the_step_object_is_reused_and_reset(make):
    inst = make("loop")
    first = inst.step(True)
    first.batch, first.did_work = 5, False
    again = inst.step(False)
    assert again is first and isinstance(again, Step)
    assert again.batch == -1 and again.did_work is None and again.has_work is False


async def test_a_single_process_loop_is_captured_through_a_real_sidecar(aiohttp_client, tmp_path, monkeypatch):
    from sidecar.service.app import ServiceSettings, make_app

    token = "probe-secret-for-instrument-tests"
    monkeypatch.setenv("SIDECAR_TOKEN", token)
    app = make_app(ServiceSettings(trace_dir=tmp_path / "traces", probe_token=token, http_token=None, max_steps=50,
                                   max_capture_bytes=1 << 30, keep=5, stop_grace_s=1.0))
    client = await aiohttp_client(app)
    url = str(client.make_url("")).rstrip("/")
    telemetry, spans, _ = in_memory_telemetry()
    inst = sidecar.instrument("loop", endpoint=url, cuda_available=False, telemetry=telemetry)
    stop = threading.Event()

    def serving_loop():
        import torch

        x = torch.randn(32, 32)
        while not stop.is_set():
            with inst.step(True) as step:
                (x @ x).sum()
                step.batch, step.tokens = 1, 1
            time.sleep(0.002)

    inst.request_started("in-flight-1", input_tokens=7)
    loop_thread = threading.Thread(target=serving_loop, daemon=True)
    loop_thread.start()
    try:
        for _ in range(300):
            procs = (await (await client.get("/processes")).json())["processes"]
            if procs:
                break
            await asyncio.sleep(0.05)
        assert [p["role"] for p in procs] == ["scheduler"]
        started = await (await client.post("/profile/start", params={"steps": "3"})).json()
        for _ in range(600):
            status = await (await client.get(f"/profile/{started['id']}")).json()
            if status["state"] in FINAL:
                break
            await asyncio.sleep(0.05)
        assert status["state"] == "done", status
        assert [(p["role"], p["steps_recorded"]) for p in status["processes"]] == [("scheduler", 3)]
        trace = json.loads(gzip.decompress(await (await client.get(status["trace"])).read()))
        assert len({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")}) == 3
        listed = await (await client.get("/requests")).json()
        assert [(r["id"], r["phase"], r["prompt_tokens"]) for r in listed["requests"]] == [("in-flight-1", "queued", 7)]
        # The single process's capture is a span too, with the sidecar's verdict, linked to the request in flight.
        for _ in range(200):
            captures = [s for s in spans.get_finished_spans() if s.name == "sidecar capture"]
            if captures:
                break
            await asyncio.sleep(0.05)
        [span] = captures
        assert span.attributes["sidecar.capture.id"] == started["id"] and span.attributes["sidecar.capture.steps"] == 3
        assert len(span.links) == 1
    finally:
        stop.set()
        loop_thread.join(10)
        inst.close()
        telemetry.shutdown()


def test_in_flight_reports_the_engines_own_view_or_none(make):
    """``in_flight``: the engine's own view instead of the request calls', or None for a process that
    reports none (another process of the engine does: the SGLang HTTP server)."""
    default = make(telemetry=False)
    default.request_started("r1", input_tokens=3)
    assert [r["id"] for r in default.probe.recorder_dump()["in_flight"]] == ["r1"]

    engine_view = [{"id": "e1", "arrived_ns": 1, "age_s": 0.0, "phase": "decode", "prompt_tokens": 2}]
    own = make(telemetry=False, in_flight=lambda: engine_view)
    own.request_started("r2")
    assert own.probe.recorder_dump()["in_flight"] == engine_view

    silent = make(telemetry=False, in_flight=None)
    silent.request_started("r3")
    dump = silent.probe.recorder_dump()
    assert "in_flight" not in dump and "in_flight_error" not in dump
