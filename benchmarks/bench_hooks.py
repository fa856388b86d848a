"""Idle cost of the vLLM hooks per step, measured directly (no server, little noise).

Times the real wrappers from plugins/sidecar_vllm/hooks.py around a do-nothing worker step, against
the same step unwrapped, with a probe attached and idle and, as in a served engine, the worker's step
telemetry on (``SIDECAR_TELEMETRY`` defaults on; its drain thread is not started: the step path's
part only). Printed as ns per step and as a share of the
1 ms engine step of the tiny model, the harshest case (docs/benchmarks.md).

python benchmarks/bench_hooks.py
"""

from __future__ import annotations

import json
import statistics
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from sidecar.integration import patching  # noqa: E402
from sidecar.probe import Probe  # noqa: E402
from sidecar.telemetry.instruments import StepInstruments  # noqa: E402
from sidecar.telemetry.steps import StepRecorder  # noqa: E402
from sidecar_vllm import hooks  # noqa: E402
from sidecar_vllm.profile import VLLM_PROFILE  # noqa: E402


class SchedulerOutput:
    # A decode step of 8 requests, one token each, as vLLM schedules it.
    num_scheduled_tokens = {f"req-{i}": 1 for i in range(8)}
    total_num_scheduled_tokens = 8


class Scheduler:
    running = [object()] * 8
    waiting = []

    def has_requests(self):
        return True


def make_classes():
    class Worker:
        def execute_model(self, scheduler_output):
            return None

        def sample_tokens(self, grammar_output):
            return 1

    class EngineCore:
        scheduler = Scheduler()

        def step(self):
            return {}, True

    return Worker, EngineCore


ROUNDS = 5


def per_call_ns(fn, number=200_000, repeat=7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def main(argv: list[str] | None = None) -> int:
    plain_worker_cls, plain_core_cls = make_classes()
    worker_cls, core_cls = make_classes()
    patching.patch(worker_cls, "execute_model", hooks._wrap_execute_model)
    patching.patch(worker_cls, "sample_tokens", hooks._wrap_sample_tokens)
    patching.patch(core_cls, "step", hooks._wrap_engine_step)
    # Not started: idle. One probe with the flight recorder (the default), one without.
    probe = Probe("worker", 0, profile=VLLM_PROFILE, endpoint="http://127.0.0.1:9", cuda_available=False)
    bare = Probe("worker", 0, profile=VLLM_PROFILE, endpoint="http://127.0.0.1:9", cuda_available=False,
                 recorder_steps=0)
    plain_w, w, plain_c, c = plain_worker_cls(), worker_cls(), plain_core_cls(), core_cls()
    bare_w, bare_c = worker_cls(), core_cls()
    w.__dict__[hooks.PROBE_ATTR] = probe
    c.__dict__[hooks.PROBE_ATTR] = probe
    bare_w.__dict__[hooks.PROBE_ATTR] = bare
    bare_c.__dict__[hooks.PROBE_ATTR] = bare
    # The worker's step telemetry, as attach_telemetry gives it (its meter does nothing here).
    from opentelemetry.metrics import NoOpMeterProvider

    instruments = StepInstruments(NoOpMeterProvider().get_meter("bench"))
    w.__dict__[hooks.STEPS_ATTR] = StepRecorder(instruments, role="worker")
    bare_w.__dict__[hooks.STEPS_ATTR] = StepRecorder(instruments, role="worker")
    so = SchedulerOutput()

    def worker_step(obj):
        return lambda: (obj.execute_model(so), obj.sample_tokens(None))

    # Alternate the measurements so that drift of the host hits each about equally.
    rounds = []
    for _ in range(ROUNDS):
        rounds.append({
            "worker_step_plain_ns": per_call_ns(worker_step(plain_w)),
            "worker_step_hooked_ns": per_call_ns(worker_step(w)),
            "worker_step_hooked_no_recorder_ns": per_call_ns(worker_step(bare_w)),
            "engine_step_plain_ns": per_call_ns(plain_c.step),
            "engine_step_hooked_ns": per_call_ns(c.step),
            "engine_step_hooked_no_recorder_ns": per_call_ns(bare_c.step),
        })
    results = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    added = (results["worker_step_hooked_ns"] - results["worker_step_plain_ns"]) + (
        results["engine_step_hooked_ns"] - results["engine_step_plain_ns"])
    results["added_ns_per_engine_step"] = added
    results["share_of_1ms_step"] = added / 1e6
    # The flight recorder's share: the same hooks with and without it, per engine step (worker + core).
    results["recorder_ns_per_engine_step"] = (
        results["worker_step_hooked_ns"] - results["worker_step_hooked_no_recorder_ns"]) + (
        results["engine_step_hooked_ns"] - results["engine_step_hooked_no_recorder_ns"])
    results["recorder_ns_per_process_step"] = [
        round(r["worker_step_hooked_ns"] - r["worker_step_hooked_no_recorder_ns"]) for r in rounds] + [
        round(r["engine_step_hooked_ns"] - r["engine_step_hooked_no_recorder_ns"]) for r in rounds]
    out = ROOT / "bench-results" / "hooks.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print("idle hook cost (worker execute_model+sample_tokens, engine core step)")
    print(f"  worker step: {results['worker_step_plain_ns']:.0f} ns plain, {results['worker_step_hooked_ns']:.0f} ns hooked")
    print(f"  engine step: {results['engine_step_plain_ns']:.0f} ns plain, {results['engine_step_hooked_ns']:.0f} ns hooked")
    print(f"  added per engine step: {added:.0f} ns = {results['share_of_1ms_step'] * 100:.3f} % of a 1 ms step "
          f"(ratio {1 / (1 + results['share_of_1ms_step']):.5f}, target >= 0.99)")
    print(f"  of which the flight recorder: {results['recorder_ns_per_engine_step']:.0f} ns per engine step "
          f"(worker + engine core; per process and round: {results['recorder_ns_per_process_step']} ns; "
          f"target <= 1000 ns per process step)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
