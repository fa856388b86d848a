"""Benchmark: ``sidecar analyze`` against Holistic Trace Analysis on the same traces.

Each tool runs in a subprocess of its own, so that its wall time includes starting Python and its
imports (what a user waits for) and its peak memory is its own. Peak memory is the child's own
VmHWM (read from /proc/self/status as it exits), not ``ru_maxrss``: Linux carries the peak RSS of
the forking parent over into a child's ``ru_maxrss`` across exec, which would inflate small figures.
HTA does what the issue compares against: load the trace and produce
its GPU kernel breakdown. The sidecar produces its whole summary (``--json``), which is more.

Runs alternate between the tools and the best wall time of ``--repeats`` runs is kept, because a
shared machine adds noise in one direction only. Results: a table on stdout and
``bench-results/analyze.json``.

Then ``sidecar diff A B --json`` against ``sidecar analyze`` of the larger of the two (issue #13: a diff
of two of the largest traces in under 2× the time of analysing one), the same way: own processes,
alternating, best wall time (and the medians). The diff reads B in a forked child while it reads A:
its peak memory is that of both processes. The largest trace is diffed against a copy of itself (two
files, as two captures of one workload are) and against the next largest. ``--diff-only`` skips HTA.

    python benchmarks/bench_analyze.py [--repeats 3] [--scaled-copies 4] [--traces DIR] [--diff-only]
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACES = REPO.parent / "shared" / "traces"
LARGEST = "v100-train-large.json.gz"
DEFAULT_NAMES = (LARGEST, "a100-train-step.json.gz", "a100-nccl-multistream.json.gz")
TARGET_SPEEDUP = 15.0  # issue #13 (issue #5 asked for 10x)
TARGET_MEMORY_RATIO = 0.25
# sidecar diff: (A, B) pairs; the same name twice is the trace against a copy of itself.
DIFF_PAIRS = ((LARGEST, LARGEST), (LARGEST, "a100-train-step.json.gz"))
TARGET_DIFF_RATIO = 2.0

# Runs first in each measured process: writes the process's peak RSS (KiB) to a file at exit.
_PEAK_PRELUDE = """
import atexit, os, re
def _peak():
    with open('/proc/self/status') as fh:
        kib = re.search(r'VmHWM:\\s+(\\d+)', fh.read()).group(1)
    with open(os.environ['BENCH_PEAK_FILE'], 'w') as out:
        out.write(kib)
atexit.register(_peak)
"""

# The same for the sidecar's commands, which fork: ``sidecar diff`` reads B in a child (sidecar/analysis/diff/pair.py),
# ``sidecar analyze`` reads a large file's head in one (sidecar/analysis/reader/halves.py). The child's peak (ru_maxrss
# of the reaped children) is added to the process's own, an upper bound of the two together, as the pages the
# child shares with its parent from the fork count twice. HTA keeps the prelude above: its figures have always
# been its main process's.
_PEAK_WITH_CHILDREN_PRELUDE = """
import atexit, os, re, resource
def _peak():
    with open('/proc/self/status') as fh:
        kib = int(re.search(r'VmHWM:\\s+(\\d+)', fh.read()).group(1))
    kib += resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(os.environ['BENCH_PEAK_FILE'], 'w') as out:
        out.write(str(kib))
atexit.register(_peak)
"""

_SIDECAR_SCRIPT = """
import runpy, sys
sys.argv = ["sidecar", "analyze", sys.argv[1], "--json"]
runpy.run_module("sidecar.cli", run_name="__main__", alter_sys=True)
"""

_DIFF_SCRIPT = """
import runpy, sys
sys.argv = ["sidecar", "diff", sys.argv[1], sys.argv[2], "--json"]
runpy.run_module("sidecar.cli", run_name="__main__", alter_sys=True)
"""

_HTA_SCRIPT = """
import logging, sys, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
analysis = TraceAnalysis(trace_dir=sys.argv[1])
kernel_types, kernels = analysis.get_gpu_kernel_breakdown(visualize=False)
print(len(kernels))
"""


def _run(cmd: Sequence[str], work: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one child process."""
    peak_file = work / "peak.kib"
    peak_file.unlink(missing_ok=True)
    env = dict(
        os.environ,
        BENCH_PEAK_FILE=str(peak_file),
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins"), os.environ.get("PYTHONPATH", "")]),
    )
    start = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr.decode('utf-8', 'replace')[-2000:]}")
    return wall, int(peak_file.read_text()) / 1024.0


def sidecar_cmd(trace: Path) -> list[str]:
    """``sidecar analyze TRACE --json``, as the console script runs it."""
    return [sys.executable, "-c", _PEAK_WITH_CHILDREN_PRELUDE + _SIDECAR_SCRIPT, str(trace)]


def diff_cmd(a: Path, b: Path) -> list[str]:
    """``sidecar diff A B --json``, as the console script runs it."""
    return [sys.executable, "-c", _PEAK_WITH_CHILDREN_PRELUDE + _DIFF_SCRIPT, str(a), str(b)]


def hta_cmd(trace_dir: Path) -> list[str]:
    return [sys.executable, "-c", _PEAK_PRELUDE + _HTA_SCRIPT, str(trace_dir)]


def json_size(trace: Path) -> int:
    with (gzip.open(trace, "rb") if trace.name.endswith(".gz") else trace.open("rb")) as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 20), b""))


def scaled_copy(source: Path, copies: int, out: Path) -> Path:
    """A trace ``copies`` times as large: the events of ``source`` repeated (same timestamps), for
    a size in the hundreds of MB that no shared trace reaches."""
    text = gzip.decompress(source.read_bytes())
    start = text.index(b"[", text.index(b'"traceEvents"')) + 1
    end = text.rindex(b"]")
    body = text[start:end].strip()
    with out.open("wb") as fh:
        fh.write(text[:start])
        for n in range(copies):
            fh.write(b",\n" if n else b"")
            fh.write(body)
        fh.write(text[end:])
    return out


def measure(label: str, trace: Path, repeats: int, work: Path) -> dict:
    hta_dir = work / f"hta-{trace.name}"
    hta_dir.mkdir(exist_ok=True)
    link = hta_dir / trace.name
    if not link.exists():
        link.symlink_to(trace.resolve())
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(_run(sidecar_cmd(trace), work))
        theirs.append(_run(hta_cmd(hta_dir), work))
    ours_s, hta_s = min(w for w, _ in ours), min(w for w, _ in theirs)
    ours_mb, hta_mb = max(m for _, m in ours), max(m for _, m in theirs)
    return {
        "trace": label,
        "file_mb": round(trace.stat().st_size / 2**20, 2),
        "json_mb": round(json_size(trace) / 2**20, 2),
        "sidecar_s": round(ours_s, 3),
        "hta_s": round(hta_s, 3),
        "speedup": round(hta_s / ours_s, 2),
        # The medians too: the best of a few runs on a shared machine can be lucky for either tool.
        "sidecar_median_s": round(statistics.median(w for w, _ in ours), 3),
        "hta_median_s": round(statistics.median(w for w, _ in theirs), 3),
        "median_speedup": round(statistics.median(w for w, _ in theirs) / statistics.median(w for w, _ in ours), 2),
        "sidecar_peak_mb": round(ours_mb, 1),
        "hta_peak_mb": round(hta_mb, 1),
        "memory_ratio": round(ours_mb / hta_mb, 3),
        "runs": {"sidecar": [[round(w, 3), round(m, 1)] for w, m in ours], "hta": [[round(w, 3), round(m, 1)] for w, m in theirs]},
    }


def measure_diff(a: Path, b: Path, repeats: int, work: Path) -> dict:
    """``sidecar diff a b`` against ``sidecar analyze`` of the larger file, alternating, best wall time."""
    if a.resolve() == b.resolve():  # two files of one content: two captures of the same workload
        copy = work / f"copy-of-{b.name}"
        copy.write_bytes(b.read_bytes())
        b = copy
    one = max((a, b), key=lambda p: p.stat().st_size)
    analyses, diffs = [], []
    for _ in range(repeats):
        analyses.append(_run(sidecar_cmd(one), work))
        diffs.append(_run(diff_cmd(a, b), work))
    analyze_s, diff_s = min(w for w, _ in analyses), min(w for w, _ in diffs)
    # The medians too: on a shared machine the best of a few runs of each can be lucky for one of them.
    analyze_med, diff_med = statistics.median(w for w, _ in analyses), statistics.median(w for w, _ in diffs)
    return {
        "a": a.name, "b": b.name, "analysed": one.name,
        "json_mb": [round(json_size(a) / 2**20, 2), round(json_size(b) / 2**20, 2)],
        "analyze_s": round(analyze_s, 3),
        "diff_s": round(diff_s, 3),
        "ratio": round(diff_s / analyze_s, 2),
        "analyze_median_s": round(analyze_med, 3),
        "diff_median_s": round(diff_med, 3),
        "median_ratio": round(diff_med / analyze_med, 2),
        "analyze_peak_mb": round(max(m for _, m in analyses), 1),
        "diff_peak_mb": round(max(m for _, m in diffs), 1),
        "runs": {"analyze": [[round(w, 3), round(m, 1)] for w, m in analyses],
                 "diff": [[round(w, 3), round(m, 1)] for w, m in diffs]},
    }


def diff_table(rows: list[dict]) -> str:
    head = (f"{'sidecar diff A B':<62} {'analyze s':>10} {'diff s':>8} {'ratio':>7} {'median ratio':>13} "
            f"{'analyze MB':>11} {'diff MB':>8}")
    lines = [head, "-" * len(head)]
    for r in rows:
        pair = f"{r['a']} vs {r['b']}"
        lines.append(f"{pair:<62} {r['analyze_s']:>10.3f} {r['diff_s']:>8.3f} {r['ratio']:>6.2f}× {r['median_ratio']:>12.2f}× "
                     f"{r['analyze_peak_mb']:>11.1f} {r['diff_peak_mb']:>8.1f}")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    head = (f"{'trace':<34} {'JSON MB':>8} {'sidecar s':>10} {'HTA s':>8} {'speed-up':>9} {'of medians':>11} "
            f"{'sidecar MB':>11} {'HTA MB':>8} {'mem ratio':>10}")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['trace']:<34} {r['json_mb']:>8.1f} {r['sidecar_s']:>10.3f} {r['hta_s']:>8.3f} {r['speedup']:>8.1f}× "
            f"{r['median_speedup']:>10.1f}× "
            f"{r['sidecar_peak_mb']:>11.1f} {r['hta_peak_mb']:>8.1f} {r['memory_ratio']:>10.3f}"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=DEFAULT_TRACES, help="folder of recorded traces (default ../shared/traces)")
    parser.add_argument("--names", nargs="*", default=list(DEFAULT_NAMES), help="trace files to run (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per tool and trace; the best wall time is kept")
    parser.add_argument("--scaled-copies", type=int, default=4, help=f"also run on {LARGEST} repeated N times (0: skip)")
    parser.add_argument("--diff-only", action="store_true", help="only sidecar diff against sidecar analyze (no HTA)")
    parser.add_argument("--out", type=Path, default=None,
                        help="results file (default bench-results/analyze.json, or analyze-diff.json with --diff-only)")
    args = parser.parse_args(argv)
    if args.out is None:
        args.out = REPO / "bench-results" / ("analyze-diff.json" if args.diff_only else "analyze.json")

    load_at_start = os.getloadavg()  # (was read at the end, after the runs had loaded the machine)
    if not args.traces.is_dir():
        print(f"bench_analyze: no traces at {args.traces}", file=sys.stderr)
        return 2
    # Measure the analyser as an installed copy runs: byte-compiled, as pip leaves a package. With
    # PYTHONDONTWRITEBYTECODE set (as on the CI machines) a module edited since `make install` is
    # otherwise compiled again in every run, which cost 30-40 ms of a 0.4 s run.
    compileall.compile_dir(str(REPO / "sidecar"), quiet=1)
    rows, diff_rows = [], []
    with tempfile.TemporaryDirectory(prefix="bench-analyze-") as tmp:
        work = Path(tmp)
        for name in ([] if args.diff_only else args.names):
            rows.append(measure(name, args.traces / name, args.repeats, work))
            print(table(rows[-1:]).splitlines()[-1], flush=True)
        if args.scaled_copies > 1 and not args.diff_only:
            big = scaled_copy(args.traces / LARGEST, args.scaled_copies, work / f"v100-train-large-x{args.scaled_copies}.json")
            rows.append(measure(big.name, big, args.repeats, work))
        for a, b in DIFF_PAIRS:
            diff_rows.append(measure_diff(args.traces / a, args.traces / b, args.repeats, work))
            print(diff_table(diff_rows[-1:]).splitlines()[-1], flush=True)
    largest = rows[0] if rows and rows[0]["trace"] == LARGEST else None
    verdict = None
    if largest:
        verdict = {
            "trace": LARGEST,
            "speedup": largest["speedup"],
            "speedup_target": TARGET_SPEEDUP,
            "speedup_met": largest["speedup"] >= TARGET_SPEEDUP,
            "memory_ratio": largest["memory_ratio"],
            "memory_target": TARGET_MEMORY_RATIO,
            "memory_met": largest["memory_ratio"] <= TARGET_MEMORY_RATIO,
        }
    diff_verdict = {
        "pair": f"{diff_rows[0]['a']} vs {diff_rows[0]['b']}",
        "ratio": diff_rows[0]["ratio"],
        "target": TARGET_DIFF_RATIO,
        "met": diff_rows[0]["ratio"] < TARGET_DIFF_RATIO,
    }
    result = {
        "benchmark": "sidecar analyze vs HTA get_gpu_kernel_breakdown; sidecar diff vs sidecar analyze",
        "command": "python benchmarks/bench_analyze.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_average_at_start": load_at_start},
        "rows": rows,
        "target": verdict,
        "diff": {"rows": diff_rows, "target": diff_verdict},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print()
    if rows:
        print(table(rows))
    print(diff_table(diff_rows))
    if verdict:
        print(
            f"\n{LARGEST}: {verdict['speedup']}× faster (target ≥ {TARGET_SPEEDUP:g}×: {'met' if verdict['speedup_met'] else 'NOT met'}), "
            f"{verdict['memory_ratio']:.2f} of HTA's peak memory (target ≤ {TARGET_MEMORY_RATIO}: {'met' if verdict['memory_met'] else 'NOT met'})"
        )
    print(f"\nsidecar diff of {diff_verdict['pair']}: {diff_verdict['ratio']}× the time of analysing one "
          f"(target < {TARGET_DIFF_RATIO:g}×: {'met' if diff_verdict['met'] else 'NOT met'})")
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
