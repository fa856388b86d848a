"""Idle cost of the vLLM hooks per step, measured directly (no server, little noise).

Times the real wrappers from plugins/sidecar_vllm/hooks.py around a do-nothing worker step, against
the same step unwrapped, with a probe attached and idle and, as in a served engine, the worker's step
telemetry on (``SIDECAR_TELEMETRY`` defaults on; its drain thread is not started: the step path's
part only). Printed as ns per step and as a share of the
1 ms engine step of the tiny model, the harshest case (docs/benchmarks.md).

The flight recorder's share is the same hooks with and without it. That difference is a few hundred
ns in calls of one to two µs, so on a shared host wall time cannot resolve it (earlier runs read
0.5-2.2 µs for the same code): time taken by other processes lands in whichever variant was
running. So every figure is the calling thread's own CPU time (``time.thread_time``: a thread that
is descheduled does not accumulate it), in many short batches (2,000 calls: most fit between two
context switches) of every variant, interleaved round after round in alternating order. Another
process still leaves cold caches behind it, which only ever adds time, so a variant's figure is the
10th percentile of its batches (the undisturbed ones; ``--quantile``), and the recorder's figure is
the difference of two such figures. Its spread is printed beside it: the same figure from the first
and the second half of the rounds, and the quartiles of the per-round differences. ``--timer wall``
measures wall time instead, to compare. (``perf stat`` counts no instructions on this virtual
machine: no hardware counters.)

python benchmarks/bench_hooks.py [--rounds 301] [--number 2000] [--quantile 0.1] [--timer cpu|wall]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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


TIMERS = {"cpu": time.thread_time, "wall": time.perf_counter}


def per_call_ns(fn, number: int, timer) -> float:
    """ns per call of ``fn`` over one batch of ``number`` calls (timeit: the collector off meanwhile)."""
    return timeit.Timer(fn, timer=timer).timeit(number) / number * 1e9


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear between the two nearest, as numpy's default)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=301, help="interleaved rounds of every variant")
    parser.add_argument("--number", type=int, default=2_000, help="calls per variant and round (one batch)")
    parser.add_argument("--quantile", type=float, default=0.1,
                        help="a variant's figure: this quantile of its batches (0.5: the median)")
    parser.add_argument("--timer", choices=sorted(TIMERS), default="cpu",
                        help="cpu: the thread's CPU time (default, robust to a shared host); wall: wall time")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "hooks.json")
    args = parser.parse_args(argv)
    if args.rounds < 4 or args.number < 1 or not 0 <= args.quantile <= 1:
        parser.error("--rounds must be at least 4, --number at least 1, --quantile within 0..1")
    timer = TIMERS[args.timer]
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

    variants = {
        "worker_step_plain_ns": worker_step(plain_w),
        "worker_step_hooked_ns": worker_step(w),
        "worker_step_hooked_no_recorder_ns": worker_step(bare_w),
        "engine_step_plain_ns": plain_c.step,
        "engine_step_hooked_ns": c.step,
        "engine_step_hooked_no_recorder_ns": bare_c.step,
    }
    for fn in variants.values():  # warm every path (specialised bytecode, caches) before timing
        per_call_ns(fn, args.number, timer)
    # Interleaved: every round measures every variant once, in alternating order, so that drift of
    # the host (and the ring's slot in the cache) hits each side of a difference about equally.
    rounds = []
    names = list(variants)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({name: per_call_ns(variants[name], args.number, timer) for name in order})
    def figure(name: str, part: list[dict]) -> float:
        return quantile([r[name] for r in part], args.quantile)

    results: dict = {k: figure(k, rounds) for k in names}
    results.update(timer=args.timer, rounds=args.rounds, number=args.number, quantile=args.quantile)
    added = (results["worker_step_hooked_ns"] - results["worker_step_plain_ns"]) + (
        results["engine_step_hooked_ns"] - results["engine_step_plain_ns"])
    results["added_ns_per_engine_step"] = added
    results["share_of_1ms_step"] = added / 1e6
    # The flight recorder's share: the same hooks with and without it.
    half = len(rounds) // 2
    for key, on, off in (("worker", "worker_step_hooked_ns", "worker_step_hooked_no_recorder_ns"),
                         ("engine_core", "engine_step_hooked_ns", "engine_step_hooked_no_recorder_ns")):
        paired = [r[on] - r[off] for r in rounds]
        results[f"recorder_ns_per_step[{key}]"] = {
            "figure": round(figure(on, rounds) - figure(off, rounds), 1),
            "first_half": round(figure(on, rounds[:half]) - figure(off, rounds[:half]), 1),
            "second_half": round(figure(on, rounds[half:]) - figure(off, rounds[half:]), 1),
            "paired_q1": round(quantile(paired, 0.25), 1), "paired_median": round(quantile(paired, 0.5), 1),
            "paired_q3": round(quantile(paired, 0.75), 1)}
    results["recorder_ns_per_engine_step"] = sum(
        results[f"recorder_ns_per_step[{key}]"]["figure"] for key in ("worker", "engine_core"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"idle hook cost (worker execute_model+sample_tokens, engine core step); {args.timer} time, "
          f"quantile {args.quantile} of {args.rounds} interleaved batches of {args.number} calls")
    print(f"  worker step: {results['worker_step_plain_ns']:.0f} ns plain, {results['worker_step_hooked_ns']:.0f} ns hooked")
    print(f"  engine step: {results['engine_step_plain_ns']:.0f} ns plain, {results['engine_step_hooked_ns']:.0f} ns hooked")
    print(f"  added per engine step: {added:.0f} ns = {results['share_of_1ms_step'] * 100:.3f} % of a 1 ms step "
          f"(ratio {1 / (1 + results['share_of_1ms_step']):.5f}, target >= 0.99)")
    print(f"  of which the flight recorder: {results['recorder_ns_per_engine_step']:.0f} ns per engine step "
          f"(worker + engine core); target <= 1000 ns per process step:")
    for key in ("worker", "engine_core"):
        d = results[f"recorder_ns_per_step[{key}]"]
        print(f"    {key:<12} {d['figure']:.0f} ns (halves of the run: {d['first_half']:.0f}, {d['second_half']:.0f} ns; "
              f"per-round differences: median {d['paired_median']:.0f}, quartiles {d['paired_q1']:.0f}-{d['paired_q3']:.0f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
