"""The vLLM worker hooks feed the step recorder: one observation per step with work, none without."""

from types import SimpleNamespace

from sidecar.integration import patching
from sidecar.telemetry.instruments import STEP_BATCH_SIZE, STEP_DURATION, STEP_TOKENS
from sidecar_vllm import hooks

from .helpers import in_memory_telemetry, metric_points


def _worker_class():
    class Worker:  # the shape of vllm.v1.worker.gpu_worker.Worker's step methods
        def execute_model(self, scheduler_output):
            return None if scheduler_output.defer else "output"

        def sample_tokens(self, grammar_output):
            return "sampled"

    patching.patch(Worker, "execute_model", hooks._wrap_execute_model)
    patching.patch(Worker, "sample_tokens", hooks._wrap_sample_tokens)
    return Worker


def _output(tokens: dict, defer: bool = True):
    return SimpleNamespace(num_scheduled_tokens=tokens, total_num_scheduled_tokens=sum(tokens.values()), defer=defer)


def test_worker_steps_become_step_metrics():
    telemetry, _, reader = in_memory_telemetry()
    worker = _worker_class()()
    recorder = telemetry.step_recorder("worker")
    worker.__dict__[hooks.STEPS_ATTR] = recorder  # no probe: step metrics work without one
    assert worker.execute_model(_output({"a": 5, "b": 1})) is None
    assert worker.sample_tokens(None) == "sampled"  # the step ends here
    assert worker.execute_model(_output({})) is None  # no work: not a step
    worker.sample_tokens(None)
    assert worker.execute_model(_output({"a": 1, "b": 1, "c": 1}, defer=False)) == "output"
    telemetry.run_tasks_once()  # the drain the sampler thread runs
    (duration,) = metric_points(reader, STEP_DURATION)
    (batch,) = metric_points(reader, STEP_BATCH_SIZE)
    (tokens,) = metric_points(reader, STEP_TOKENS)
    assert duration.count == batch.count == tokens.count == 2
    assert batch.sum == 2 + 3 and tokens.sum == 6 + 3
    assert dict(duration.attributes) == {"sidecar.process.role": "worker"}
    assert recorder.dropped == 0
    telemetry.shutdown()


def test_telemetry_attaches_once_and_not_when_switched_off(monkeypatch):
    monkeypatch.setenv("SIDECAR_METRICS_PUSH", "0")
    monkeypatch.setenv("SIDECAR_TELEMETRY", "0")
    off = _worker_class()()
    hooks._attach_telemetry(off, "worker", 0, steps=True)
    assert off.__dict__[hooks.STEPS_ATTR] is None and off.__dict__[hooks.TELEMETRY_ATTR] is None
    assert off.execute_model(_output({"a": 1}, defer=False)) == "output"  # unhooked path

    monkeypatch.setenv("SIDECAR_TELEMETRY", "1")
    on = _worker_class()()
    hooks._attach_telemetry(on, "worker", 0, steps=True)
    telemetry, recorder = on.__dict__[hooks.TELEMETRY_ATTR], on.__dict__[hooks.STEPS_ATTR]
    hooks._attach_telemetry(on, "worker", 0, steps=True)
    assert on.__dict__[hooks.TELEMETRY_ATTR] is telemetry and on.__dict__[hooks.STEPS_ATTR] is recorder
    on.execute_model(_output({"a": 2}, defer=False))
    assert recorder.observed == 1
    telemetry.shutdown()


def test_the_flight_recorder_shares_the_telemetrys_clock_reads():
    from sidecar.probe import Probe
    from sidecar_vllm.profile import VLLM_PROFILE

    telemetry, _, _ = in_memory_telemetry()
    worker = _worker_class()()
    recorder = telemetry.step_recorder("worker")
    probe = Probe("worker", 0, profile=VLLM_PROFILE, endpoint="http://127.0.0.1:9", cuda_available=False)
    worker.__dict__[hooks.STEPS_ATTR] = recorder
    worker.__dict__[hooks.PROBE_ATTR] = probe
    worker.execute_model(_output({"a": 5, "b": 1, "c": 1}))
    worker.sample_tokens(None)
    (_, start_ns, end_ns, batch, tokens), = recorder._buffer
    rows = probe.ring.dump(0)["steps"]
    # One step, one pair of clock reads: the recorder's row and the step metric say the same times.
    assert rows["start_ns"] == [start_ns] and rows["end_ns"] == [end_ns] and end_ns >= start_ns > 0
    assert rows["batch"] == [batch] == [3] and rows["tokens"] == [tokens] == [7]
    assert rows["prefill_tokens"] == [5] and rows["decode_tokens"] == [2]
    assert probe.ring.open_since_ns == 0 and probe.ring.step_thread_id is not None
    probe.close()
    telemetry.shutdown()
