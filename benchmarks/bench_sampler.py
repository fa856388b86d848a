"""Issue 15 benchmark: what sampling the step thread's Python stack costs (sidecar/stacks/sampler.py).

Measured in one process, no server:
  per sample   the sampler thread's CPU time per sample (thread_time_ns, so it includes its sleep and
               wake-up system calls), with the target parked at a stack depth of 20, 60 and 120
               frames, and at 60 frames with 30 more idle threads in the process
               (sys._current_frames() builds a frame for every thread)
  CPU share    the sampler thread's CPU time over its active time at 1000 Hz (target parked, 60 frames)
  slowdown     a target thread running a fixed amount of work, sampled at 1000 Hz vs not sampled,
               in alternating pairs (order flipped every pair), ratio per pair and median. The GIL
               is shared: every sample stops the target for its cost, which is the figure that
               matters to serving. Two targets: pure Python (scheduler-like: calls, dicts, lists,
               40 frames deep), which holds the GIL, so the sampler gets in only at the switch
               interval; and mixed (half of the time in hashlib, which releases the GIL, as a torch
               op does), where the sampler runs at its full rate.
  hand-over    the mixed run's samples: what the probe's export thread pays in the engine process
               (``dump``: the raw samples file), and what the sidecar then does off the engine
               (reading it, the summary, the slices inserted into a 20 MB Kineto-like JSON file)

python benchmarks/bench_sampler.py [--pairs 10] [--seconds 0.2] [--hz 1000] [--out bench-results/sampler.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sidecar.stacks import sampled as sampled_stacks  # noqa: E402
from sidecar.stacks.sampler import StackSampler  # noqa: E402
from sidecar.service.export.kineto_file import copy_with_events  # noqa: E402
from sidecar.stacks.samples_file import check, read  # noqa: E402

DEFAULT_HZ = 1000.0  # the sampler's default rate; --hz changes it for a run


# -- targets --------------------------------------------------------------------------------------------
def parked_at_depth(depth: int, ready: threading.Event, release: threading.Event) -> None:
    if depth > 1:
        parked_at_depth(depth - 1, ready, release)
    else:
        ready.set()
        release.wait()


class Request:
    __slots__ = ("rid", "tokens", "done")

    def __init__(self, rid: int) -> None:
        self.rid, self.tokens, self.done = rid, [], False


def schedule_once(queue: list, budget: dict) -> int:
    """Scheduler-like pure Python: a pass over the running requests, dict and list work."""
    scheduled = 0
    for req in queue:
        if budget.get(req.rid, 0) < 16:
            budget[req.rid] = budget.get(req.rid, 0) + 1
            req.tokens.append(scheduled)
            scheduled += 1
    if len(queue[0].tokens) > 64:
        for req in queue:
            req.tokens.clear()
        budget.clear()
    return scheduled


def python_work(depth: int, rounds: int) -> int:
    if depth > 0:
        return python_work(depth - 1, rounds)
    queue = [Request(i) for i in range(64)]
    budget: dict = {}
    total = 0
    for _ in range(rounds):
        total += schedule_once(queue, budget)
    return total


_BLOB = b"x" * (1 << 16)


def mixed_work(depth: int, rounds: int) -> int:
    if depth > 0:
        return mixed_work(depth - 1, rounds)
    queue = [Request(i) for i in range(64)]
    budget: dict = {}
    total = 0
    for _ in range(rounds):
        total += schedule_once(queue, budget)
        hashlib.sha256(_BLOB).digest()  # releases the GIL (data over 2 KiB), like a torch op
    return total


def calibrate_rounds(work, seconds: float) -> int:
    rounds = 16
    while True:
        t0 = time.perf_counter()
        work(40, rounds)
        took = time.perf_counter() - t0
        if took >= 0.05:
            return max(1, int(rounds * seconds / took))
        rounds *= 2


def summary_of(sampler: StackSampler, top: int = 10) -> dict:
    """The samples' summary, as the sidecar builds it (stops the sampler)."""
    return sampled_stacks.summary(check(sampler.raw()), top)


# -- measurements ---------------------------------------------------------------------------------------
def sleep_cpu_us(calls: int = 300) -> float:
    """CPU time of one ``time.sleep(0.0009)`` (the sampler's sleep between samples): the part of a
    sample's CPU cost spent without the GIL, in the kernel."""
    cpu0 = time.thread_time_ns()
    for _ in range(calls):
        time.sleep(0.0009)
    return (time.thread_time_ns() - cpu0) / calls / 1000


def per_sample_cost(depth: int, seconds: float, sleep_us: float, extra_threads: int = 0,
                    hz: float = DEFAULT_HZ) -> dict:
    ready, release = threading.Event(), threading.Event()
    target = threading.Thread(target=parked_at_depth, args=(depth, ready, release), daemon=True)
    target.start()
    ready.wait()
    idle = [threading.Thread(target=release.wait, daemon=True) for _ in range(extra_threads)]
    for t in idle:
        t.start()
    sampler = StackSampler(target.ident, hz=hz)
    try:
        sampler.start()
        time.sleep(seconds)
        threads = threading.active_count()
        summary = summary_of(sampler)
    finally:
        sampler.close()
        release.set()
        target.join()
        for t in idle:
            t.join()
    n = summary["samples"]
    return {
        "depth": depth,
        "threads": threads,  # in the process while sampling (the sampler's included)
        "samples": n,
        "achieved_hz": summary["achieved_hz"],
        "cpu_us_per_sample": round(summary["sampler_cpu_s"] * 1e6 / n, 2) if n else None,
        # What the sample itself costs (the GIL is held for it): CPU per sample minus the sleep.
        "gil_us_per_sample": round(max(0.0, summary["sampler_cpu_s"] * 1e6 / n - sleep_us), 2) if n else None,
        "cpu_share": summary["sampler_cpu_share"],
    }


def timed_run(work, rounds: int, sampled: bool, hz: float = DEFAULT_HZ) -> tuple[float, Optional[dict]]:
    """Run ``work`` on this thread; with a sampler sampling this thread when ``sampled``. The
    sampler is made (its thread started) before the clock starts and closed after it stops."""
    sampler = StackSampler(threading.get_ident(), hz=hz) if sampled else None
    try:
        if sampler is not None:
            sampler.start()
        t0 = time.perf_counter()
        work(40, rounds)
        took = time.perf_counter() - t0
        if sampler is not None:
            sampler.stop()
            return took, summary_of(sampler, top=3)
        return took, None
    finally:
        if sampler is not None:
            sampler.close()


def slowdown(work, seconds: float, pairs: int, hz: float = DEFAULT_HZ) -> dict:
    rounds = calibrate_rounds(work, seconds)
    work(40, rounds // 4)  # warm-up
    plain, sampled, ratios, rates, samples, shares = [], [], [], [], [], []
    for k in range(pairs):
        order = (False, True) if k % 2 == 0 else (True, False)
        took = {}
        for flag in order:
            took[flag], summary = timed_run(work, rounds, flag, hz)
            if summary is not None:
                rates.append(summary["achieved_hz"])
                samples.append(summary["samples"])
                shares.append(summary["sampler_cpu_share"])
        plain.append(took[False])
        sampled.append(took[True])
        ratios.append(took[True] / took[False])
    median_ratio = statistics.median(ratios)
    return {
        "rounds": rounds,
        "plain_s": [round(x, 4) for x in plain],
        "sampled_s": [round(x, 4) for x in sampled],
        "ratios": [round(r, 4) for r in ratios],
        "ratio_of_minima": round(min(sampled) / min(plain), 4),
        "median_ratio": round(median_ratio, 4),
        "slowdown_pct": round((median_ratio - 1) * 100, 2),
        "median_plain_s": round(statistics.median(plain), 4),
        "median_sampled_s": round(statistics.median(sampled), 4),
        "achieved_hz": round(statistics.median(rates), 1),
        "samples_per_run": int(statistics.median(samples)),
        "sampler_cpu_share": round(statistics.median(shares), 4),
        "us_lost_per_sample": round((statistics.median(sampled) - statistics.median(plain)) * 1e6
                                    / max(1, statistics.median(samples)), 2),
    }


def handover_cost(seconds: float, hz: float = DEFAULT_HZ) -> dict:
    """Sample the mixed target for ``seconds``; dump its samples (the probe's side), then read them,
    summarise them and insert their slices into a 20 MB Kineto-like file (the sidecar's side)."""
    rounds = calibrate_rounds(mixed_work, seconds)
    sampler = StackSampler(threading.get_ident(), hz=hz)
    try:
        sampler.start()
        mixed_work(40, rounds)
        sampler.stop()
        sampler.wait_idle(5)
        with tempfile.TemporaryDirectory() as tmp:
            samples_file = os.path.join(tmp, "trace.stacks.msgpack")
            t0, cpu0 = time.perf_counter(), time.thread_time()
            dumped = sampler.dump(samples_file)
            dump_s, dump_cpu = time.perf_counter() - t0, time.thread_time() - cpu0

            path = os.path.join(tmp, "trace.json")
            event = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 1,
                                "ts": 4524126168659.238, "dur": 12.5, "args": {"External id": 12, "Sequence number": 3}})
            count = (20 << 20) // (len(event) + 2)
            base = 1790857026000000000
            with open(path, "w") as f:
                f.write('{"schemaVersion": 1, "deviceProperties": [], '
                        f'"baseTimeNanoseconds": {base}, "traceEvents": [\n')
                f.write(",\n".join([event] * count))
                f.write('\n], "traceName": "bench"}\n')
            size = os.path.getsize(path)
            t0 = time.perf_counter()
            samples = read(samples_file)
            summary = sampled_stacks.summary(samples)
            with open(path, "rb") as src, open(path + ".out", "wb") as dst:
                added = copy_with_events(src, dst, sampled_stacks.iter_events(samples, base))
            sidecar_s = time.perf_counter() - t0
            grown = os.path.getsize(path + ".out") - size
    finally:
        sampler.close()
    return {"trace_mb": round(size / 2**20, 1), "samples": summary["samples"], "samples_file_bytes": dumped,
            "dump_s": round(dump_s, 4), "dump_cpu_s": round(dump_cpu, 4), "events_added": added,
            "bytes_added": grown, "estimated_bytes": summary["estimated_bytes"], "sidecar_s": round(sidecar_s, 3)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="sampled/plain pairs per target")
    parser.add_argument("--seconds", type=float, default=0.2, help="length of one timed run")
    parser.add_argument("--hz", type=float, default=DEFAULT_HZ, help="sampling rate (default %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "sampler.json")
    args = parser.parse_args(list(argv) if argv is not None else None)
    hz = args.hz

    load_before = os.getloadavg()
    sleep_us = sleep_cpu_us()
    costs = [per_sample_cost(d, args.seconds, sleep_us, hz=hz) for d in (20, 60, 120)]
    costs.append(per_sample_cost(60, args.seconds, sleep_us, extra_threads=30, hz=hz))
    pure = slowdown(python_work, args.seconds, args.pairs, hz)
    mixed = slowdown(mixed_work, args.seconds, args.pairs, hz)
    handover = handover_cost(args.seconds, hz)
    results = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "switch_interval_ms": sys.getswitchinterval() * 1000,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "sleep_cpu_us": round(sleep_us, 2),
        "hz": hz,
        "per_sample": costs,
        "cpu_share_depth60": costs[1]["cpu_share"],
        "slowdown_pure_python": pure,
        "slowdown_mixed": mixed,
        "handover": handover,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))

    print(f"stack sampler at {hz:.0f} Hz (python {results['python']}, {results['cpus']} CPUs, "
          f"switch interval {results['switch_interval_ms']:.0f} ms)")
    print(f"  host load average {results['load_average_before_after'][0]} before, "
          f"{results['load_average_before_after'][1]} after (figures on a busy host run high)")
    print(f"  cost per sample, target parked (sampler thread CPU; the sleep between samples alone costs "
          f"{sleep_us:.1f} µs of it, without the GIL):")
    for c in costs:
        extra = " (+30 idle threads)" if c is costs[-1] else ""
        print(f"    depth {c['depth']:>3}{extra}: {c['cpu_us_per_sample']} µs CPU/sample, about "
              f"{c['gil_us_per_sample']} µs of it with the GIL; {c['achieved_hz']:.0f} Hz, "
              f"sampler CPU share {c['cpu_share'] * 100:.1f} %")
    for label, r in (("pure Python", pure), ("mixed (half GIL-free)", mixed)):
        print(f"  slowdown of a {label} target sampled vs not ({args.pairs} alternating pairs): "
              f"median ratio {r['median_ratio']:.4f} = {r['slowdown_pct']:+.2f} % "
              f"(pairs {', '.join(f'{x:.3f}' for x in r['ratios'])}; best run vs best run "
              f"{r['ratio_of_minima']:.4f}); "
              f"{r['achieved_hz']:.0f} Hz achieved, {r['us_lost_per_sample']} µs lost per sample")
    print(f"  hand-over of {handover['samples']} samples: the probe's dump {handover['samples_file_bytes'] / 1024:.0f} KiB "
          f"in {handover['dump_s'] * 1000:.1f} ms ({handover['dump_cpu_s'] * 1000:.1f} ms CPU) in the engine process; "
          f"the sidecar's read, summary and {handover['events_added']} events "
          f"({handover['bytes_added'] / 1024:.0f} KiB, estimated {handover['estimated_bytes'] / 1024:.0f} KiB) "
          f"into a {handover['trace_mb']} MB trace {handover['sidecar_s']} s")
    print(f"  -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
