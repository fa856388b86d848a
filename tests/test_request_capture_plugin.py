"""The vLLM side of request-scoped captures, without a server: the header read where vLLM reads a
request's propagation headers, the generate call held until the capture is armed (and left alone
without an ask), the capture ended with the request through the engine core, which ends it in every
worker, on their step threads."""

from __future__ import annotations

import asyncio
import threading

import pytest
from starlette.datastructures import Headers

from sidecar.integration import patching
from sidecar.integration.attach import PROBE_ATTR
from sidecar.probe import Probe
from sidecar.probe.request_capture import CaptureOutcome, RequestCaptureAsks
from sidecar.common.protocol import (REQUEST_ENDED, Arm, CaptureReport, CaptureSpec, RequestCapture, RequestCaptureAnswer,
                              RequestCaptureRelease)
from sidecar_vllm import capture_end, request_capture
from sidecar_vllm.request_capture import _ASK, CAPTURED, GATE_ATTR, RequestCaptureGate


def test_the_patches_apply_to_vllm():
    from vllm.entrypoints.serve.engine.serving import BaseServing
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_worker import Worker

    request_capture.install()
    request_capture.install()  # idempotent
    capture_end.install()
    assert getattr(BaseServing._get_trace_headers, patching.MARK)
    assert getattr(AsyncLLM.generate, patching.MARK)
    assert EngineCore.__dict__[capture_end.END_CAPTURE] is capture_end.end_capture_in_engine_core
    assert Worker.__dict__[capture_end.END_CAPTURE] is capture_end.end_capture_in_worker


def test_vllm_reads_the_ask_with_the_trace_headers_once_per_request():
    from vllm.entrypoints.serve.engine.serving import BaseServing

    request_capture.install()
    serving = BaseServing.__new__(BaseServing)

    async def handler(headers):
        first = await serving._get_trace_headers(headers)
        ask = _ASK.get()
        await serving._get_trace_headers(headers)  # the request's next prompt: the same ask
        assert _ASK.get() is ask
        return first, ask

    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    trace, ask = asyncio.run(handler(Headers({"X-Sidecar-Profile": "1", "traceparent": traceparent})))
    assert trace == {"traceparent": traceparent} and ask.profile.asked and not ask.taken
    _, none = asyncio.run(handler(Headers({"traceparent": traceparent})))
    assert none is None
    _, bad = asyncio.run(handler(Headers({"X-Sidecar-Profile": "banana"})))
    assert not bad.profile.asked and "banana" in bad.profile.problem


# -- the generate call held until armed ---------------------------------------------------------------
class EngineCore:
    """The API server's engine-core client: records utility calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    async def call_utility_async(self, method, *args):
        self.calls.append((method, *args))


class Engine:
    """An AsyncLLM's generate, as vLLM's: it adds the request (where telemetry reads ``CAPTURED``),
    then yields outputs."""

    def __init__(self) -> None:
        self.engine_core = EngineCore()
        self.seen: list = []

    async def generate(self, prompt, sampling_params, request_id, *, trace_headers=None):
        self.seen.append((request_id, CAPTURED.get()))
        for i in range(3):
            await asyncio.sleep(0)
            yield f"{request_id}:{i}"


Engine.generate = request_capture._wrap_generate(Engine.generate)


class Sidecar:
    """The probe's link and the sidecar behind it, answering from another thread."""

    def __init__(self, answer) -> None:
        self.connected = threading.Event()
        self.connected.set()
        self.sent: list = []
        self.answer = answer
        self.asks = RequestCaptureAsks(self.send, self.connected, "http://sidecar:8787", wait_s=0.5)

    def send(self, msg) -> None:
        self.sent.append(msg)
        if isinstance(msg, RequestCapture) and self.answer is not None:
            threading.Thread(target=self.asks.on_answer, args=(self.answer(msg),)).start()


def armed(msg):
    return RequestCaptureAnswer(ask=msg.ask, capture_id="20261123-000000-aaaaaa", url="/profile/20261123-000000-aaaaaa")


def gated(answer=armed):
    engine, sidecar = Engine(), Sidecar(answer)
    engine.__dict__[GATE_ATTR] = RequestCaptureGate(engine, sidecar.asks, steps=32)
    return engine, sidecar


async def consume(engine, request_id="cmpl-a-0", headers=None):
    """What vLLM's handler does: read the headers, then generate."""
    if headers is not None:
        _ASK.set(request_capture._Ask(headers, request_capture.read_profile_ask(headers)))
    outputs = [out async for out in engine.generate("prompt", None, request_id)]
    await asyncio.sleep(0.01)  # the end is a task of its own
    return outputs


def test_a_request_that_asks_waits_for_its_capture_and_ends_it_with_itself():
    engine, sidecar = gated()
    outputs = asyncio.run(consume(engine, headers=Headers({"X-Sidecar-Profile": "1"})))
    assert outputs == ["cmpl-a-0:0", "cmpl-a-0:1", "cmpl-a-0:2"]
    assert sidecar.sent == [RequestCapture(ask=1, request_id="cmpl-a-0", steps=32)]
    [(request_id, outcome)] = engine.seen
    assert isinstance(outcome, CaptureOutcome) and outcome.capture_id == "20261123-000000-aaaaaa"
    assert outcome.url == "http://sidecar:8787/profile/20261123-000000-aaaaaa"
    assert engine.engine_core.calls == [(capture_end.END_CAPTURE, "20261123-000000-aaaaaa")]


def test_a_request_without_an_ask_gets_vllms_generator_untouched():
    engine, sidecar = gated()
    assert asyncio.run(consume(engine)) == ["cmpl-a-0:0", "cmpl-a-0:1", "cmpl-a-0:2"]
    assert sidecar.sent == [] and engine.seen == [("cmpl-a-0", None)] and engine.engine_core.calls == []
    # Without a gate (no probe in this process), an ask changes nothing either.
    bare = Engine()
    asyncio.run(consume(bare, headers=Headers({"X-Sidecar-Profile": "1"})))
    assert bare.seen == [("cmpl-a-0", None)]


def test_one_capture_per_http_request_and_skips_reach_telemetry():
    engine, sidecar = gated(lambda m: RequestCaptureAnswer(ask=m.ask, skipped="busy: capture x is capturing"))

    async def two_prompts():
        headers = Headers({"X-Sidecar-Profile": "yes"})
        _ASK.set(request_capture._Ask(headers, request_capture.read_profile_ask(headers)))
        return [[o async for o in engine.generate("p", None, f"cmpl-b-{i}")] for i in range(2)]

    asyncio.run(two_prompts())
    assert len(sidecar.sent) == 1, "the request's second prompt does not ask again"
    assert [o.skipped if o else None for _, o in engine.seen] == ["busy: capture x is capturing", None]
    assert engine.engine_core.calls == [], "no capture, nothing to end"
    # A value that is no boolean asks nothing of the sidecar; the span says why.
    engine, sidecar = gated()
    asyncio.run(consume(engine, headers=Headers({"X-Sidecar-Profile": "banana"})))
    assert sidecar.sent == [] and "banana" in engine.seen[0][1].skipped


def test_a_request_cancelled_while_it_waits_never_reaches_the_engine():
    engine, sidecar = gated(answer=None)  # the sidecar never answers
    sidecar.asks._wait_s = 5

    async def main():
        task = asyncio.ensure_future(consume(engine, headers=Headers({"X-Sidecar-Profile": "1"})))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert engine.seen == [] and isinstance(sidecar.sent[-1], RequestCaptureRelease)


def test_a_sidecar_that_does_not_answer_delays_the_request_at_most_the_wait():
    engine, sidecar = gated(answer=None)
    sidecar.asks._wait_s = 0.1
    outputs = asyncio.run(consume(engine, headers=Headers({"X-Sidecar-Profile": "1"})))
    assert len(outputs) == 3 and engine.seen[0][1].skipped == "no answer from the sidecar within 0.1 s"


# -- the end, on the step threads ---------------------------------------------------------------------
class Core:
    def __init__(self, probe, workers) -> None:
        self.__dict__[PROBE_ATTR] = probe
        self.workers = workers

    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        return [getattr(w, method)(*args) for w in self.workers]


class Worker:
    def __init__(self, probe) -> None:
        self.__dict__[PROBE_ATTR] = probe


Core._inference_sidecar_end_capture = capture_end.end_capture_in_engine_core
Worker._inference_sidecar_end_capture = capture_end.end_capture_in_worker


class WorkerProbe:
    """A worker's probe as the end sees it (one torch.profiler per process: the engine core's is real)."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, str]] = []

    def end_capture(self, job_id, reason):
        self.ended.append((job_id, reason))
        return True


def test_the_engine_core_ends_its_capture_then_every_workers():
    probe = Probe("engine_core", None, endpoint="http://127.0.0.1:9", cuda_available=False)
    sent = []
    probe._link.send = sent.append
    probe._on_message(Arm(spec=CaptureSpec(id="r1", steps=32, request_id="cmpl-a-0")))
    for _ in range(2):
        probe.step_begin(True)
        probe.step_end(True)
    workers = [WorkerProbe(), WorkerProbe()]
    core = Core(probe, [Worker(w) for w in workers])
    assert core._inference_sidecar_end_capture("r1") is True
    assert probe._capture is None
    [stopped] = [m for m in sent if isinstance(m, CaptureReport) and m.state == "exporting"]
    assert (stopped.steps_recorded, stopped.stop_reason) == (2, REQUEST_ENDED)
    assert [w.ended for w in workers] == [[("r1", REQUEST_ENDED)]] * 2
    assert core._inference_sidecar_end_capture("r1") is False  # already ended here; the workers are asked anyway
    assert Core(None, [Worker(None)])._inference_sidecar_end_capture("r1") is False  # no probe attached


def test_the_gate_is_attached_to_the_api_servers_engine_unless_turned_off(monkeypatch):
    probe = Probe("api_server", None, endpoint="http://127.0.0.1:9", cuda_available=False)
    engine = Engine()
    monkeypatch.setenv("SIDECAR_REQUEST_CAPTURE_STEPS", "12")
    gate = request_capture.attach_request_captures(engine, probe)
    assert engine.__dict__[GATE_ATTR] is gate and gate.steps == 12
    monkeypatch.setenv("SIDECAR_REQUEST_CAPTURE_STEPS", "0")
    assert request_capture.attach_request_captures(Engine(), probe) is None
    worker = Probe("worker", 0, endpoint="http://127.0.0.1:9", cuda_available=False)
    assert worker.request_captures is None and request_capture.attach_request_captures(Engine(), worker) is None
