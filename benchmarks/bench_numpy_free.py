"""Benchmark: would ``sidecar analyze`` be faster without numpy? (issue 13's 15x target)

The numpy import is the largest single item of a ``sidecar analyze --json`` run that the analysis
itself does not need to read the trace. Dropping it means doing the analyses in plain Python. This
measures the two sides on the largest shared trace, with the analysis's single largest step as the
sample: the tree of host events (which op encloses which, for self times and call chains).

* ``import numpy``: a fresh interpreter that imports it, less a bare one, both set up as the command
  sets up its process (best of ``--repeats``, alternating);
* the tree of every host thread, as the analysis builds it (``nesting.build_tree``: vectorised), and
  as a plain-Python stack walk over the same columns (the reference method in nesting.py's
  docstring: order by start, longest first among equal starts, pop what ended). Both give the same
  parents and child times, checked here.

If the walk alone costs about as much as the import plus the vectorised tree, a numpy-free analysis
cannot be faster: every other analysis would then add its own plain-Python pass on top.

    python benchmarks/bench_numpy_free.py [--repeats 7] [--trace PATH]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "v100-train-large.json.gz"


# Both interpreters set up as ``sidecar analyze`` sets up its process (sidecar/cli/one_shot.py):
# no cyclic GC, no OpenBLAS worker threads, nothing collected at exit. The import then costs what
# the command pays for it.
_ONE_SHOT = "import gc, sys; gc.disable(); {}; gc.freeze()"


def import_cost(repeats: int) -> tuple[float, float]:
    """Best wall time of a fresh interpreter with and without ``import numpy``."""
    best = {"bare": float("inf"), "numpy": float("inf")}
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    for _ in range(repeats):
        for label, code in (("bare", "pass"), ("numpy", "import numpy")):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", _ONE_SHOT.format(code)], check=True, env=env)
            best[label] = min(best[label], time.perf_counter() - start)
    return best["bare"], best["numpy"]


def python_tree(ts: list[float], dur: list[float]) -> tuple[list[int], list[float]]:
    """Parent and child time of each event by the stack walk, in plain Python."""
    n = len(ts)
    order = sorted(range(n), key=ts.__getitem__)  # stable: file order among equal starts
    k = 0
    while k < n - 1:  # equal starts (a parent and its first child): longest first
        j = k
        while j + 1 < n and ts[order[j + 1]] == ts[order[k]]:
            j += 1
        if j > k:
            order[k : j + 1] = sorted(order[k : j + 1], key=lambda i: -dur[i])
        k = j + 1
    parent = [-1] * n
    child = [0.0] * n
    stack: list[int] = []
    ends: list[float] = []
    for i in order:
        start = ts[i]
        end = start + dur[i]
        while ends and ends[-1] <= start:
            ends.pop()
            stack.pop()
        if stack:
            p = stack[-1]
            parent[i] = p
            child[p] += min(end, ends[-1]) - start
        stack.append(i)
        ends.append(end)
    return parent, child


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    args = parser.parse_args(argv)

    from sidecar.analysis.reader.nesting import build_tree
    from sidecar.analysis.summary import load

    data = load(args.trace)
    threads = list(data.threads.values())
    columns = [(t.ts.tolist(), t.dur.tolist()) for t in threads]
    for thread, (ts, dur) in zip(threads, columns):
        tree = build_tree(thread)
        parent, child = python_tree(ts, dur)
        if tree.parent.tolist() != parent or tree.child_time.tolist() != child:
            print("the plain-Python tree differs from nesting.build_tree", file=sys.stderr)
            return 1
    vectorised = walk = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        for thread in threads:
            build_tree(thread)
        middle = time.perf_counter()
        for ts, dur in columns:
            python_tree(ts, dur)
        vectorised, walk = min(vectorised, middle - start), min(walk, time.perf_counter() - middle)
    bare, with_numpy = import_cost(args.repeats)
    events = sum(len(t.ts) for t in threads)
    print(f"{args.trace.name}: {events:,} host events in {len(threads)} threads, best of {args.repeats}")
    print(f"  import numpy (fresh interpreter, less a bare one)   {1000 * (with_numpy - bare):7.1f} ms")
    print(f"  host-event tree, numpy (nesting.build_tree)          {1000 * vectorised:7.1f} ms")
    print(f"  host-event tree, plain-Python stack walk             {1000 * walk:7.1f} ms")
    print(f"  walk less (import + numpy tree)                      {1000 * (walk - with_numpy + bare - vectorised):+7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
