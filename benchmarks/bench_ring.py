"""What the flight recorder costs a process: ns per recorded step, bytes per ring, the GC callback,
and how long a dump holds the GIL on the thread that takes it.

* ``begin()`` + ``end(...)`` with the counts an engine core passes (keywords, as a hook would;
  and by position), timeit, median of 7 repeats of 200,000 pairs. Target: at most 1,000 ns on a slow 2-core host
  (issue 11). The same pair of calls into empty methods is printed beside it: the part any hook
  pays for two Python calls.
* Memory of a default StepRing, GcPauses and RequestRing.
* The GC callback: ``gc.collect(0)`` of an empty young generation with and without it installed.
* ``dump()`` of a full default StepRing (the link thread holds the GIL meanwhile).

python benchmarks/bench_ring.py
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from sidecar.probe.flight_ring import GcPauses, RequestRing, StepRing  # noqa: E402


class EmptyRing:
    """The cost of the calls themselves: same signatures, no work."""

    def begin(self) -> None:
        pass

    def end(self, step, working, batch=-1, tokens=-1, prefill_tokens=-1, decode_tokens=-1, running=-1,
            waiting=-1) -> None:
        pass


def per_call_ns(fn, number: int = 200_000, repeat: int = 7) -> float:
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def step_pair(ring):
    def pair():
        ring.begin()
        ring.end(12345, True, batch=8, tokens=520, prefill_tokens=512, decode_tokens=8, running=8, waiting=3)
    return pair


def positional_step_pair(ring):
    def pair():
        ring.begin()
        ring.end(12345, True, 8, 520, 512, 8, 8, 3)
    return pair


def gc_collect_ns(pauses: GcPauses | None) -> float:
    if pauses is not None:
        pauses.install()
    try:
        return per_call_ns(lambda: gc.collect(0), number=20_000)
    finally:
        if pauses is not None:
            pauses.uninstall()


def main(argv: list[str] | None = None) -> int:
    ring = StepRing()
    results = {
        "step_pair_ns": per_call_ns(step_pair(ring)),
        "step_pair_positional_ns": per_call_ns(positional_step_pair(ring)),
        "empty_pair_ns": per_call_ns(step_pair(EmptyRing())),
        "step_ring_bytes": ring.memory_bytes,
        "step_ring_rows": ring.capacity,
        "gc_ring_bytes": GcPauses().memory_bytes,
        "request_ring_bytes": RequestRing().memory_bytes,
        "gc_collect0_plain_ns": gc_collect_ns(None),
        "gc_collect0_recorded_ns": gc_collect_ns(GcPauses()),
    }
    full = StepRing()
    pair = step_pair(full)
    for _ in range(full.capacity):
        pair()
    dumps = []
    for _ in range(5):
        t0 = time.perf_counter()
        full.dump()
        dumps.append(time.perf_counter() - t0)
    results["full_dump_ms"] = statistics.median(dumps) * 1e3
    out = ROOT / "bench-results" / "ring.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print("flight recorder (sidecar/probe/flight_ring.py)")
    print(f"  begin()+end(...): {results['step_pair_ns']:.0f} ns per step "
          f"(two empty calls: {results['empty_pair_ns']:.0f} ns; target <= 1000 ns); "
          f"counts passed by position: {results['step_pair_positional_ns']:.0f} ns")
    print(f"  StepRing: {results['step_ring_rows']} rows, {results['step_ring_bytes']:,} bytes "
          f"({results['step_ring_bytes'] / 2**20:.2f} MiB); GcPauses {results['gc_ring_bytes']:,} bytes; "
          f"RequestRing {results['request_ring_bytes']:,} bytes + its id strings")
    print(f"  gc.collect(0): {results['gc_collect0_plain_ns']:.0f} ns plain, "
          f"{results['gc_collect0_recorded_ns']:.0f} ns with the GC callback")
    print(f"  dump() of a full StepRing: {results['full_dump_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
