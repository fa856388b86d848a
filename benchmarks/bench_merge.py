"""Benchmark: peak memory and time of merging a capture's raw traces in the sidecar, streaming
(``sidecar.service.export.merge``) against the merge it replaced, which loaded each raw trace whole with
``json.load`` (``reference_finalize`` below, with a switch to leave the analysis out). The reference
copies none of the product's code: it loads every raw trace whole and holds them all, as the old
merge did, then hands the loaded events to the product's own writer
(``sidecar.service.export.merged_trace.write_merged``) and compressor; how the events are read is
the one thing the two measure differently.

The capture is the largest shared trace, decompressed into ``raw/`` as a probe writes it (plain
Kineto JSON), ``--copies`` times as ranks of one capture. Each merge runs in a subprocess of its
own, alternating between the two, best wall time of ``--repeats``; its peak memory is the child's
own VmHWM read from /proc/self/status as it exits (``ru_maxrss`` of a child can carry the forking
parent's peak). ``merge`` is what the merge does (compress each file, merge them; analysis off);
``capture`` is all of ``finalize_capture`` (with the analysis of the merged trace, which streams
too). The merged traces of both are compared byte for byte, and a process that only imports the
same modules gives the floor under both peaks. Results: a table on stdout and
``bench-results/merge.json``.

    python benchmarks/bench_merge.py [--repeats 3] [--copies 1] [--trace PATH]
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "v100-train-large.json.gz"
IMPLS = ("json.load", "streaming")


# -- the merge before it streamed: each raw trace loaded whole with json.load ---------------------------
def reference_finalize(capture_dir: Path, records, max_bytes: int, analyse: bool = True):
    """The merge as it was before it streamed: every raw trace of the capture loaded whole with
    ``json.load`` and all of them held until the merged trace is written. Compressing, merging and
    the analysis are the product's own code (``merged_trace.write_merged`` fed the loaded events in
    place of its streaming reader). ``max_bytes`` as ``finalize_capture``'s: a capture over it is
    refused (the benchmark's never is)."""
    from sidecar.service.export import merged_trace
    from sidecar.service.export.compression import compress
    from sidecar.service.export.merge import (MERGED_NAME, PROCESS_TRACE_SUFFIX, FinalizeResult, ProcessOutcome,
                                              RawTrace, _analyse)
    from sidecar.service.export.raw_trace import HEADER_MEMBERS

    result = FinalizeResult()
    traces: list = []
    events: dict[str, list] = {}  # each raw trace's events, loaded whole, by path
    total = 0
    for rec in sorted(records, key=lambda r: r.sort_key):
        if rec.state != "done" or not rec.raw_file:
            continue
        raw = Path(rec.raw_file)
        total += raw.stat().st_size
        if total > max_bytes:
            raise ValueError(f"capture over {max_bytes} bytes")
        with raw.open("rb") as fh:
            data = json.load(fh)
        if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
            raise ValueError(f"{raw}: not a Kineto trace (no traceEvents list)")
        events[str(raw)] = data["traceEvents"]
        gz_name = rec.stem + PROCESS_TRACE_SUFFIX
        compress(raw, capture_dir / gz_name)
        result.processes[rec.stem] = ProcessOutcome(file=gz_name, bytes=(capture_dir / gz_name).stat().st_size)
        traces.append(RawTrace(rec, raw, {k: v for k, v in data.items() if k in HEADER_MEMBERS}))
    shutil.rmtree(capture_dir / "raw", ignore_errors=True)

    if traces:
        merged = capture_dir / MERGED_NAME
        streaming = merged_trace.read_events
        merged_trace.read_events = lambda path, *args, **kwargs: iter((events[path],))  # one batch: all of it
        try:
            merged_trace.write_merged(merged, traces)
        finally:
            merged_trace.read_events = streaming
        result.trace_file, result.trace_bytes = MERGED_NAME, merged.stat().st_size
        if analyse:
            result.summary_file, result.headline = _analyse(capture_dir, merged)
    return result


# -- a capture's process records, as the sidecar's capture model has them ---------------------------------
@dataclass
class Record:
    role: str
    pid: int
    rank: Optional[int]
    label: str
    stem: str
    step_driven: bool = True
    state: str = "done"
    raw_file: Optional[str] = None

    @property
    def sort_key(self) -> tuple:  # as sidecar.common.protocol.ProcessIdentity.sort_key
        return (self.step_driven, self.rank is not None, self.rank or 0, self.role, self.pid)


def worker(rank: int, pid: int) -> Record:
    return Record("worker", pid, rank, f"worker rank {rank} (pid {pid})", f"worker-rank{rank}-pid{pid}")


# -- measuring ------------------------------------------------------------------------------------------
# Runs in each measured process: merges the capture in argv[2] with the implementation in argv[1],
# prints the seconds finalize took, and writes the process's peak RSS (KiB) to a file at exit.
_CHILD = """
import atexit, json, os, re, sys, time
from pathlib import Path
def _peak():
    with open('/proc/self/status') as fh:
        kib = re.search(r'VmHWM:\\s+(\\d+)', fh.read()).group(1)
    with open(os.environ['BENCH_PEAK_FILE'], 'w') as out:
        out.write(kib)
atexit.register(_peak)
sys.path.insert(0, os.environ['BENCH_DIR'])
import bench_merge
from sidecar.service.export import merge
impl, capture, analyse = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == '1'
records = [bench_merge.Record(**r) for r in json.loads(sys.argv[4])]
start = time.perf_counter()
if impl == 'imports only':
    pass
elif impl == 'json.load':
    bench_merge.reference_finalize(capture, records, 1 << 40, analyse=analyse)
else:
    if not analyse:
        merge._analyse = lambda *a: (None, None)
    merge.finalize_capture(capture, records, 1 << 40)
print(time.perf_counter() - start)
"""


def _records(raw_dir: Path, copies: int) -> list[dict]:
    out = []
    for k in range(copies):
        rec = worker(k, 1000 + k)
        rec.raw_file = str(raw_dir / f"{rec.stem}.json")
        out.append(rec.__dict__)
    return out


def _run(impl: str, template: Path, work: Path, records: list[dict], analyse: bool) -> tuple[float, float, str]:
    capture = work / f"{impl}-{'capture' if analyse else 'merge'}"
    shutil.rmtree(capture, ignore_errors=True)
    shutil.copytree(template, capture)
    recs = [{**r, "raw_file": str(capture / "raw" / Path(r["raw_file"]).name)} for r in records]
    peak_file = work / "peak"
    env = {**os.environ, "BENCH_PEAK_FILE": str(peak_file), "BENCH_DIR": str(Path(__file__).resolve().parent)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, impl, str(capture), "1" if analyse else "0", json.dumps(recs)],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{impl} merge failed:\n{proc.stderr}")
    seconds = float(proc.stdout.strip().splitlines()[-1])
    peak_mib = int(peak_file.read_text()) / 1024
    merged = capture / "trace.json.gz"
    digest = hashlib.sha256(gzip.decompress(merged.read_bytes())).hexdigest() if merged.exists() else ""
    return seconds, peak_mib, digest


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a Kineto trace (.json or .json.gz)")
    parser.add_argument("--copies", type=int, default=1, help="ranks in the capture, each a copy of the trace")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "merge.json")
    args = parser.parse_args(argv)
    if not args.trace.is_file():
        print(f"bench_merge: {args.trace} not found (the shared traces beside the repository); skipped", file=sys.stderr)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-merge-") as tmp:
        work = Path(tmp)
        template = work / "template"
        (template / "raw").mkdir(parents=True)
        records = _records(template / "raw", args.copies)
        opener = gzip.open if args.trace.read_bytes()[:2] == b"\x1f\x8b" else open
        with opener(args.trace, "rb") as src, open(records[0]["raw_file"], "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        for r in records[1:]:
            shutil.copyfile(records[0]["raw_file"], r["raw_file"])
        raw_mb = sum(Path(r["raw_file"]).stat().st_size for r in records) / 1e6
        results: dict[str, dict[str, dict[str, float]]] = {}
        digests: set[str] = set()
        floor = _run("imports only", template, work, records, False)[1]  # the interpreter and the imports
        for mode, analyse in (("merge", False), ("capture", True)):
            for _ in range(args.repeats):
                for impl in IMPLS:
                    seconds, peak, digest = _run(impl, template, work, records, analyse)
                    digests.add(digest)
                    best = results.setdefault(mode, {}).setdefault(impl, {"seconds": seconds, "peak_mib": peak})
                    best["seconds"] = min(best["seconds"], seconds)
                    best["peak_mib"] = min(best["peak_mib"], peak)
    identical = len(digests) == 1
    print(f"{args.trace.name}: {args.copies} raw file(s), {raw_mb:.0f} MB of JSON; best of {args.repeats}")
    print(f"{'':8} {'json.load time':>15} {'streaming time':>15} {'json.load peak':>15} {'streaming peak':>15} {'peak ratio':>11}")
    for mode, row in results.items():
        old, new = row["json.load"], row["streaming"]
        print(f"{mode:8} {old['seconds']:>14.2f}s {new['seconds']:>14.2f}s {old['peak_mib']:>11.0f} MiB "
              f"{new['peak_mib']:>11.0f} MiB {new['peak_mib'] / old['peak_mib']:>11.2f}")
    print(f"(a process that only imports the same modules peaks at {floor:.0f} MiB)")
    print(f"merged traces identical: {'yes' if identical else 'NO'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"trace": args.trace.name, "copies": args.copies, "raw_mb": round(raw_mb, 1),
                                    "repeats": args.repeats, "imports_only_peak_mib": round(floor, 1),
                                    "results": results, "identical": identical}, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
