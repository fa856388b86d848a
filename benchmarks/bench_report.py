"""Benchmark: the HTML capture report against the analysis it draws (issue #16: generating the report
for the largest shared trace takes under 1 s beyond the analysis itself).

Measured in this process, best of ``--repeats`` (a shared machine adds noise in one direction only):

* ``analysis``: ``analyze_path`` of the trace (what ``sidecar analyze`` and a capture's export do);
* ``report``: what ``GET /profile/{id}/report`` does with the saved summary: ``json.loads`` of its text,
  then ``render_capture_report``; and ``write_html_report`` (``sidecar analyze --html``), which adds
  the file write;
* ``cold``: in a fresh Python, importing ``sidecar.report`` and rendering once (the first request);
* ``1000 steps``: the largest page a capture can make under the default ``--max-steps`` (1000), the
  trace's summary with 1000 steps in each of 4 processes, each step split into phases as a vLLM
  capture's are, so that the per-step parts are measured at their bound too.

Results: a table on stdout and ``bench-results/report.json``.

    python benchmarks/bench_report.py [--repeats 5] [--trace PATH]
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sidecar.analysis import analyze_path  # noqa: E402
from sidecar.report import render_capture_report, write_html_report  # noqa: E402

TRACES = REPO.parent / "shared" / "traces"
TARGET_S = 1.0

_COLD = """
import json, sys, time
text = open(sys.argv[1]).read()
t = time.perf_counter()
from sidecar.report import render_capture_report
render_capture_report(json.loads(text))
print(time.perf_counter() - t)
"""


def best(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
    return min(times), result


def thousand_steps(summary: dict, processes: int = 4, steps: int = 1000) -> dict:
    """``summary`` with ``processes`` copies of its first process, ``steps`` steps each (its own steps
    repeated end to end): the per-step rows, timeline marks and tables at the capture's bound."""
    big = copy.deepcopy(summary)
    first = big["processes"][0]
    base = [s for s in first["steps"] if not s.get("partial")] or first["steps"]
    span = max(s["start_at_us"] + s["wall_us"] for s in base) if base else 1.0
    big["processes"], big["steps"] = [], []
    anatomy = {"phases": {"prepare": "prepare inputs", "forward": "forward", "sample": "sample"}, "processes": [],
               "between_forwards": [], "largest": None}
    for p in range(processes):
        proc = copy.deepcopy(first)
        proc["label"] = f"worker rank {p} (pid {1000 + p})"
        proc["pid"], proc["rank"] = 1000 + p, p
        rows = []
        for i in range(steps):
            row = dict(base[i % len(base)], step=i + 1, process=proc["label"], pid=proc["pid"], rank=p)
            row["start_at_us"] += span * (i // len(base))
            rows.append(row)
        proc["steps"], proc["window_us"] = rows, span * (steps // len(base) + 1)
        big["processes"].append(proc)
        big["steps"].extend(rows)
        anatomy["processes"].append(_anatomy_of(proc))
    big["anatomy"] = anatomy
    return big


# A capture of real vLLM has its steps' phases (docs/analysis.md, Step anatomy): each step is drawn as
# several marks then, so the bound is measured with phases in every step (shares of a typical worker step).
_SHARES = {"prepare": 0.1, "forward": 0.55, "sample": 0.1}


def _anatomy_of(proc: dict) -> dict:
    rows = [{"step": r["step"], "partial": False, "wall_us": r["wall_us"],
             "phases_us": {p: r["wall_us"] * f for p, f in _SHARES.items()},
             "unphased_us": r["wall_us"] * (1 - sum(_SHARES.values()))} for r in proc["steps"]]
    mean = {p: sum(r["phases_us"][p] for r in rows) / len(rows) for p in _SHARES}
    return {"process": proc["label"], "pid": proc["pid"], "rank": proc["rank"], "steps_of": None,
            "complete_steps": len(rows), "partial_steps": 0, "mean_us": mean,
            "total_us": {p: m * len(rows) for p, m in mean.items()}, "steps": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--trace", type=Path, default=None, help="default: the largest trace in ../shared/traces")
    args = parser.parse_args(argv)
    trace = args.trace or max(TRACES.glob("*.json.gz"), key=lambda p: p.stat().st_size)

    analysis_s, summary = best(lambda: analyze_path(trace), args.repeats)
    text = json.dumps(summary, indent=1)  # as a capture saves it (merge.py)
    render_s, page = best(lambda: render_capture_report(json.loads(text)), args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.html"
        write_s, _ = best(lambda: write_html_report(summary, out), args.repeats)
        (Path(tmp) / "summary.json").write_text(text)
        cold = [float(subprocess.run([sys.executable, "-c", _COLD, str(Path(tmp) / "summary.json")], cwd=REPO,
                                     check=True, capture_output=True, text=True).stdout) for _ in range(3)]
        big = thousand_steps(summary)
        big_text = json.dumps(big, indent=1)
        big_s, big_page = best(lambda: render_capture_report(json.loads(big_text)), args.repeats)

    rows = [
        ("analysis (analyze_path)", analysis_s, ""),
        ("report, served (json.loads + render)", render_s, f"{len(page) / 1e3:.0f} kB of HTML"),
        ("report, --html file (render + write)", write_s, ""),
        ("report, cold (import + first render)", min(cold), "fresh interpreter"),
        ("report, 4 x 1000 steps", big_s, f"{len(big_page) / 1e6:.1f} MB of HTML"),
    ]
    print(f"trace: {trace.name} ({trace.stat().st_size / 1e6:.1f} MB gzip, "
          f"{sum(f['events'] for f in summary['source']['files']):,} events); best of {args.repeats}")
    print(f"{'':40} {'seconds':>9}  {'vs analysis':>11}")
    for name, seconds, note in rows:
        print(f"{name:40} {seconds:9.4f}  {seconds / analysis_s:10.1%}  {note}")
    worst = max(render_s, write_s, min(cold), big_s)
    verdict = "PASS" if worst < TARGET_S else "FAIL"
    print(f"{verdict}: the slowest report generation takes {worst:.3f} s beyond the analysis (target < {TARGET_S:g} s)")

    results = REPO / "bench-results"
    results.mkdir(exist_ok=True)
    (results / "report.json").write_text(json.dumps({
        "trace": trace.name, "repeats": args.repeats, "python": platform.python_version(),
        "machine": platform.machine(), "analysis_s": analysis_s, "render_served_s": render_s,
        "render_file_s": write_s, "render_cold_s": min(cold), "render_4x1000_steps_s": big_s,
        "html_bytes": len(page), "html_bytes_4x1000_steps": len(big_page), "target_s": TARGET_S,
        "pass": worst < TARGET_S,
    }, indent=1))
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
