"""Per-step cost of the public API (``sidecar.instrument``) against the layer under it (the probe's own
``step_begin``/``step_end``, which the vLLM and SGLang step hooks call): why those hooks call the probe
directly (docs/engine-api.md "Adding an engine", docs/benchmarks.md).

One idle probe (no sidecar listening; its link thread retries in the background), telemetry off, a
do-nothing step of 8 requests and 8 tokens, three ways:

- ``probe``: ``probe.step_begin(True)`` / ``probe.step_end(True, 8, 8, 0, 8, 8, 0)``, as the hooks do;
- ``instrument_calls``: ``inst.step_begin(True)`` / ``inst.step_end(True, 8, 8, 0, 8, 8, 0)``;
- ``instrument_with``: ``with inst.step() as step:`` setting the same counts.

Timed as bench_hooks.py times the hooks: the calling thread's CPU time, in batches of ``--number``
steps, every variant once per round in alternating order, a variant's figure the ``--quantile`` of
its batches (the undisturbed ones on a shared host).

python benchmarks/bench_instrument.py [--rounds 101] [--number 2000] [--quantile 0.1]
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

import sidecar  # noqa: E402
from bench_hooks import quantile  # noqa: E402  (the same quantile as the probe's figures beside these)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=101)
    parser.add_argument("--number", type=int, default=2_000)
    parser.add_argument("--quantile", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "instrument.json")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.number < 1 or not 0 <= args.quantile <= 1:
        parser.error("--rounds must be at least 2, --number at least 1, --quantile within 0..1")
    inst = sidecar.instrument("bench", telemetry=False, endpoint="http://127.0.0.1:9", cuda_available=False,
                              trace_root=ROOT / "bench-results" / "instrument-traces")
    probe = inst.probe
    if probe is None:
        parser.error("the probe did not start (SIDECAR_DISABLE set?)")

    def by_probe():
        probe.step_begin(True)
        probe.step_end(True, 8, 8, 0, 8, 8, 0)

    def by_calls():
        inst.step_begin(True)
        inst.step_end(True, 8, 8, 0, 8, 8, 0)

    def by_with():
        with inst.step() as step:
            step.batch = step.tokens = step.decode_tokens = step.running = 8
            step.prefill_tokens = step.waiting = 0

    variants = {"probe": by_probe, "instrument_calls": by_calls, "instrument_with": by_with}
    timer = time.thread_time
    for fn in variants.values():  # warm each path first
        timeit.Timer(fn, timer=timer).timeit(args.number)
    rounds = []
    names = list(variants)
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({n: timeit.Timer(variants[n], timer=timer).timeit(args.number) / args.number * 1e9
                       for n in order})
    inst.close()
    results = {f"{n}_ns": round(quantile([r[n] for r in rounds], args.quantile), 1) for n in names}
    results.update(rounds=args.rounds, number=args.number, quantile=args.quantile, timer="cpu")
    for n in ("instrument_calls", "instrument_with"):
        paired = [r[n] - r["probe"] for r in rounds]
        results[f"{n}_added_ns"] = {"figure": round(results[f"{n}_ns"] - results["probe_ns"], 1),
                                    "paired_median": round(quantile(paired, 0.5), 1),
                                    "paired_q1": round(quantile(paired, 0.25), 1),
                                    "paired_q3": round(quantile(paired, 0.75), 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"one idle step (begin + end), thread CPU time, quantile {args.quantile} of {args.rounds} "
          f"interleaved batches of {args.number}")
    print(f"  probe (the hooks' layer):     {results['probe_ns']:.0f} ns")
    for n, label in (("instrument_calls", "inst.step_begin/step_end:"), ("instrument_with", "with inst.step():        ")):
        d = results[f"{n}_added_ns"]
        print(f"  {label}    {results[f'{n}_ns']:.0f} ns (+{d['figure']:.0f}; per-round differences: median "
              f"{d['paired_median']:.0f}, quartiles {d['paired_q1']:.0f}-{d['paired_q3']:.0f} ns)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
