"""Benchmark: one capture across many ranks (issue 14, "Many ranks"): time to a merged trace and
summary, and the sidecar's peak memory, for 8, 16, 32 and 64 ranks.

A real sidecar (``sidecar serve``, a subprocess of its own for each rank count, so that its peak
memory is its own: sidecar_process.py) and N simulated GPU worker ranks that speak the real probe
channel from one asyncio loop in this process (simulated_ranks.py), with heartbeats whose
working-step count advances at ``--step-rate`` in every rank alike. Each rank's raw trace is a real
Kineto GPU trace (``--trace``: by default the shared ``a100-nccl-multistream``, 9.8 MB of JSON, about
41k events, NCCL kernels on several streams) rewritten for that rank: its own host pid,
``distributedInfo`` rank and world size, and a base time a quarter of a millisecond after the
previous rank's. The files are written before the capture starts and moved into
``<root>/captures/<id>/raw/`` when a rank reports ``done``, as a probe's export leaves them: the
figures are the sidecar's, not the disk's.

Measured per rank count: the time from ``POST /profile/start`` to the verdict (the capture ``done``,
its merged trace and summary written), and from the last rank's ``done`` to the verdict (the
sidecar's own part: compressing, merging and analysing); the sidecar's resident memory when idle
with every probe connected, its peak (``VmHWM`` of /proc/<pid>/status, read at the end) and its
CPU time. The capture is checked: state ``done``, every rank in the merged trace's header and in the
summary's processes. ``--breakdown`` also runs ``merge.finalize_capture`` in a process of its own
on the largest count's files and reports the peak of each of its steps (checking the raw traces,
compressing them, merging, analysing the merged trace), each peak reset before its step
(``/proc/self/clear_refs``). Results: a table on stdout and ``bench-results/many_ranks.json``.

    python benchmarks/bench_many_ranks.py [--ranks 8,16,32,64] [--trace PATH] [--steps 3] [--breakdown]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for _path in (HERE, REPO):  # run as a script from anywhere: its helpers beside it, the project above
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from sidecar_process import RssSampler, Sidecar  # noqa: E402
from simulated_ranks import PID_BASE, TraceTemplate, identity, run_capture, stage_traces  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "a100-nccl-multistream.json.gz"
DEFAULT_RANKS = (8, 16, 32, 64)


# -- one rank count ---------------------------------------------------------------------------------------
def measure(ranks: int, template: TraceTemplate, work: Path, steps: int, step_rate: float) -> dict:
    work.mkdir(parents=True)
    root = work / "probe-root"
    staged = stage_traces(template, ranks, work / "staged")
    raw_bytes = sum(p.stat().st_size for p in staged)
    sidecar = Sidecar(work)
    idle: dict[str, float] = {}
    try:
        def connected() -> None:
            idle["rss_kib"] = sidecar.status_kib("VmRSS")
            idle["hwm_kib"] = sidecar.status_kib("VmHWM")
            idle["cpu_s"] = sidecar.cpu_s()

        with RssSampler(sidecar) as sampler:
            run = asyncio.run(run_capture(sidecar.url, root, staged, sidecar.token, steps=steps,
                                          step_rate=step_rate, on_connected=connected))
        peak_kib = sidecar.status_kib("VmHWM")
        cpu_s = sidecar.cpu_s() - idle["cpu_s"]
    finally:
        sidecar.close()
    capture = run.capture
    ranks_in_trace = sorted(p["rank"] for p in run.merged_processes if p["rank"] is not None)
    summary_ranks = sorted(p["rank"] for p in (run.summary or {}).get("processes", []) if p["rank"] is not None)
    problems = []
    if capture["state"] != "done":
        problems.append(f"capture {capture['state']}: {capture['reason']}")
    if ranks_in_trace != list(range(ranks)):
        problems.append(f"the merged trace holds ranks {ranks_in_trace}")
    if sorted(set(summary_ranks)) != list(range(ranks)):
        problems.append(f"the summary holds ranks {sorted(set(summary_ranks))}")
    files_bytes = sum(p["bytes"] or 0 for p in capture["processes"])
    return {
        "ranks": ranks,
        "raw_mb": round(raw_bytes / 1e6, 1),
        "merged_mb": round((capture["trace_bytes"] or 0) / 1e6, 1),
        "per_rank_gz_mb": round(files_bytes / 1e6, 1),
        "state": capture["state"],
        "headline": capture["headline"],
        "start_to_verdict_s": round(run.start_to_verdict_s, 2),
        "start_to_last_done_s": round(run.start_to_last_done_s, 2),
        "last_done_to_verdict_s": round(run.last_done_to_verdict_s, 2),
        "per_rank_s": round(run.last_done_to_verdict_s / ranks, 3),
        "rss_idle_mib": round(idle["rss_kib"] / 1024, 1),
        "peak_mib": round(peak_kib / 1024, 1),
        "peak_before_capture_mib": round(idle["hwm_kib"] / 1024, 1),
        "increase_mib": round((peak_kib - idle["rss_kib"]) / 1024, 1),
        "sampled_peak_mib": round(max((kib for _t, kib in sampler.samples), default=0) / 1024, 1),
        "sidecar_cpu_s": round(cpu_s, 1),
        "rss_timeline_mib": _thin([(t, round(kib / 1024, 1)) for t, kib in sampler.samples], 400),
        "problems": problems,
    }


def _thin(samples: list, most: int) -> list:
    step = max(1, len(samples) // most)
    return samples[::step]


# -- where the memory goes, step by step (--breakdown) ---------------------------------------------------
# In a process of its own: finalize_capture on staged raw traces, each of its steps wrapped to report
# the process's peak over that step (the peak is reset before each: /proc/self/clear_refs, "5").
_BREAKDOWN = r"""
import json, re, sys, time
from pathlib import Path
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
from sidecar.common.protocol import ProcessIdentity
from sidecar.service.export import merge

def kib(field):
    with open('/proc/self/status') as fh:
        return int(re.search(field + r':\s+(\d+)', fh.read()).group(1))

def reset():
    try:
        with open('/proc/self/clear_refs', 'w') as fh:
            fh.write('5')
    except OSError:
        pass

steps = {}
def wrap(name, fn):
    def wrapped(*a, **k):
        reset()
        start, before = time.perf_counter(), kib('VmRSS')
        try:
            return fn(*a, **k)
        finally:
            row = steps.setdefault(name, {"calls": 0, "seconds": 0.0, "peak_kib": 0, "rss_before_kib": before})
            row["calls"] += 1
            row["seconds"] += time.perf_counter() - start
            row["peak_kib"] = max(row["peak_kib"], kib('VmHWM'))
    return wrapped

merge.check_trace = wrap("check (first pass over each raw trace)", merge.check_trace)
merge.compress_with_stacks = wrap("compress (each raw trace)", merge.compress_with_stacks)
merge.write_merged = wrap("merge (second pass, all ranks)", merge.write_merged)
merge._analyse = wrap("analyse the merged trace", merge._analyse)
capture = Path(sys.argv[2])
records = []
for spec in json.loads(sys.argv[3]):
    ident = ProcessIdentity(role="worker", role_label="worker", step_driven=True, pid=spec["pid"], rank=spec["rank"])
    records.append(SimpleNamespace(label=ident.label, role="worker", pid=ident.pid, rank=ident.rank, step_driven=True,
                                   sort_key=ident.sort_key, stem=ident.file_stem, state="done",
                                   raw_file=spec["raw_file"], stacks="none", stack_summary=None, stacks_file=None,
                                   clock_correction_ns=0))
reset()
start = time.perf_counter()
result = merge.finalize_capture(capture, records, 1 << 50)
total = time.perf_counter() - start
print(json.dumps({"steps": steps, "seconds": total, "peak_kib_last_step": kib('VmHWM'),
                  "trace_bytes": result.trace_bytes, "problems": result.problems}))
"""


def breakdown(ranks: int, template: TraceTemplate, work: Path) -> dict:
    capture = work / "capture"
    raw = capture / "raw"
    paths = stage_traces(template, ranks, raw)
    specs = []
    for rank, path in enumerate(paths):
        stem = identity(rank, PID_BASE + rank).file_stem
        target = raw / f"{stem}.json"
        path.rename(target)
        specs.append({"rank": rank, "pid": PID_BASE + rank, "raw_file": str(target)})
    proc = subprocess.run([sys.executable, "-c", _BREAKDOWN, str(REPO), str(capture), json.dumps(specs)],
                          capture_output=True, text=True, cwd=REPO, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"breakdown failed:\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(capture, ignore_errors=True)
    return {"ranks": ranks, "seconds": round(out["seconds"], 2), "steps": {
        name: {"seconds": round(row["seconds"], 2), "calls": row["calls"],
               "rss_before_mib": round(row["rss_before_kib"] / 1024, 1), "peak_mib": round(row["peak_kib"] / 1024, 1)}
        for name, row in out["steps"].items()}}


# -- the report -------------------------------------------------------------------------------------------
def growth(rows: list[dict]) -> dict:
    first, last = rows[0], rows[-1]
    ratio = last["ranks"] / first["ranks"]

    def times(key: str) -> float | None:
        return round(last[key] / first[key], 2) if first[key] else None

    return {"ranks": f"{first['ranks']} -> {last['ranks']} (x{ratio:g})",
            "last_done_to_verdict": times("last_done_to_verdict_s"),
            "start_to_verdict": times("start_to_verdict_s"),
            "per_rank_s": times("per_rank_s"),
            "peak_mib": times("peak_mib"),
            "increase_mib": times("increase_mib")}


def print_table(trace: str, template: TraceTemplate, rows: list[dict]) -> None:
    print(f"{trace}: {len(template.text) / 1e6:.1f} MB of JSON, {template.events:,} events per rank")
    print(f"{'ranks':>5} {'raw MB':>7} {'merged MB':>9} {'start->done':>11} {'last rank->done':>15} {'per rank':>8} "
          f"{'idle RSS':>9} {'peak RSS':>9} {'increase':>9} {'CPU s':>6}  state")
    for r in rows:
        print(f"{r['ranks']:>5} {r['raw_mb']:>7.0f} {r['merged_mb']:>9.1f} {r['start_to_verdict_s']:>10.1f}s "
              f"{r['last_done_to_verdict_s']:>14.1f}s {r['per_rank_s']:>7.2f}s {r['rss_idle_mib']:>5.0f} MiB "
              f"{r['peak_mib']:>5.0f} MiB {r['increase_mib']:>5.0f} MiB {r['sidecar_cpu_s']:>6.1f}  {r['state']}"
              + (f"  PROBLEMS: {'; '.join(r['problems'])}" if r["problems"] else ""))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)),
                        help="rank counts to measure, comma-separated (default %(default)s)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a Kineto GPU trace (.json or .json.gz)")
    parser.add_argument("--steps", type=int, default=3, help="steps in each capture (default %(default)s)")
    parser.add_argument("--step-rate", type=float, default=20.0, help="the simulated engine's steps/s (default %(default)s)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also measure each step of finalize_capture on the largest count, in a process of its own")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "many_ranks.json")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.ranks.split(",") if n.strip()]
    if not args.trace.is_file():
        print(f"bench_many_ranks: {args.trace} not found (the shared traces beside the repository); skipped",
              file=sys.stderr)
        return 0
    template = TraceTemplate.load(args.trace)
    rows = []
    parts = None
    with tempfile.TemporaryDirectory(prefix="bench-many-ranks-") as tmp:
        for n in counts:
            rows.append(measure(n, template, Path(tmp) / f"ranks-{n}", args.steps, args.step_rate))
            print(f"  {n} ranks: {rows[-1]['last_done_to_verdict_s']} s, peak {rows[-1]['peak_mib']} MiB", file=sys.stderr)
        if args.breakdown:
            parts = breakdown(max(counts), template, Path(tmp) / "breakdown")
    print_table(args.trace.name, template, rows)
    report = {"trace": args.trace.name, "trace_mb": round(len(template.text) / 1e6, 1), "events_per_rank": template.events,
              "steps": args.steps, "step_rate": args.step_rate, "rows": rows}
    if len(rows) > 1:
        report["growth"] = growth(rows)
        g = report["growth"]
        print(f"growth {g['ranks']}: time after the last rank x{g['last_done_to_verdict']}, per rank x{g['per_rank_s']}, "
              f"peak RSS x{g['peak_mib']}, increase over idle x{g['increase_mib']}")
    if parts is not None:
        report["breakdown"] = parts
        print(f"finalize_capture, {parts['ranks']} ranks, in a process of its own ({parts['seconds']} s):")
        for name, row in parts["steps"].items():
            print(f"  {name:<40} {row['seconds']:>7.1f} s  peak {row['peak_mib']:>6.0f} MiB (RSS before {row['rss_before_mib']:.0f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
