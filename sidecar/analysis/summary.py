"""``analyze_path``: a trace file or a folder of rank files in, the stable summary dict out.

Files are read one at a time and only each process's results are kept, so memory is bounded by
the largest single file's compact event arrays, never by the sum of the files. The dict layout is
documented field by field in docs/analysis.md; ``schema_version`` changes when a field changes
meaning or disappears (new fields may be added within a version).
"""

from __future__ import annotations

import os
import msgspec
from pathlib import Path

from . import collectives, cpu, gaps, intervals, kernels, launches, steps, syncs
from .collect import Collector, TraceData
from .errors import TraceFormatError
from .processes import split_processes
from .stream import TopLevel, read_events
from .view import ProcessView

SCHEMA_VERSION = 1
_TRACE_SUFFIXES = (".json", ".json.gz")


class ProcessResult(msgspec.Struct):
    view_label: str
    gpu: kernels.GpuStats
    collectives: collectives.CollectiveStats
    cpu: cpu.CpuStats
    launches: launches.LaunchStats
    syncs: list[syncs.SyncFinding]
    gaps: gaps.GapPart
    window: tuple[float, float]
    json: dict


def trace_files(path: str | os.PathLike) -> list[Path]:
    """The trace files behind ``path``: the file itself, or the .json/.json.gz files of a folder."""
    p = Path(path)
    if p.is_dir():
        found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(_TRACE_SUFFIXES))
        if not found:
            raise TraceFormatError(str(p), "the folder holds no .json or .json.gz trace files")
        return found
    if not p.exists():
        raise TraceFormatError(str(p), "no such file or folder")
    return [p]


def load(path: str | os.PathLike) -> TraceData:
    """Stream one trace file into compact arrays."""
    top = TopLevel()
    collector = Collector(str(path))
    for batch in read_events(str(path), top):
        collector.add(batch)
    return collector.finish(top.members, top.skipped_events)


def analyze_process(view: ProcessView, top_n: int) -> ProcessResult:
    window = view.window()
    gpu = kernels.gpu_stats(view, window)
    busy_all = intervals.union(*intervals.concat(list(gpu.device_busy.values())))
    found_syncs = syncs.find_syncs(view, busy_all)
    found_gaps = gaps.find_gaps(view, gpu, found_syncs, describe_top=top_n)
    comm = collectives.collective_stats(view)
    ops = cpu.cpu_stats(view)
    launch_calls = launches.launches(view)
    launch_stats = launches.launch_stats(launch_calls[1])
    step_list = steps.step_stats(view, launch_calls, found_syncs, found_gaps)
    gap_part = gaps.part(view, found_gaps, window[0], top_n)
    body = {
        "label": view.label,
        "pid": view.pid,
        "rank": view.rank,
        "file": view.data.path,
        "start_ts_us": kernels.us(window[0]),
        "window_us": kernels.us(window[1] - window[0]),
        "gpu": kernels.to_json(gpu, top_n),
        "launches": launches.to_json(launch_stats),
        "gaps": gaps.summarize([gap_part], top_n),
        "collectives": collectives.to_json(comm, top_n),
        "cpu": cpu.to_json(ops, top_n),
        "syncs": syncs.summarize(found_syncs),
        "steps": steps.to_json(view, step_list, window[0]),
    }
    return ProcessResult(view.label, gpu, comm, ops, launch_stats, found_syncs, gap_part, window, body)


def analyze_path(path: str | os.PathLike, top_n: int = 10) -> dict:
    """Analyse a trace file (.json or .json.gz, gzip detected by content) or a folder of rank
    files. Raises TraceFormatError for anything unreadable."""
    if top_n < 1:
        raise ValueError("top_n must be at least 1")
    files = []
    results: list[ProcessResult] = []
    warnings: list[str] = []
    for file in trace_files(path):
        data = load(file)
        views = split_processes(data)
        files.append(
            {
                "path": str(file),
                "bytes": file.stat().st_size,
                "events": data.event_count,
                "time_resolution": "ns" if data.fractional_ts else "us",
                "processes": len(views),
            }
        )
        if data.skipped_count:
            warnings.append(f"{file.name}: {data.skipped_count} events skipped: fields of unusable type")
        if data.ignored_count:
            warnings.append(f"{file.name}: {data.ignored_count} events without a usable 'X' timestamp ignored")
        results.extend(analyze_process(view, top_n) for view in views)
        del data, views
    return _summary(path, files, results, warnings, top_n)


def _summary(path, files: list[dict], results: list[ProcessResult], warnings: list[str], top_n: int) -> dict:
    gpu = kernels.merge(r.gpu for r in results)
    comm = collectives.CollectiveStats()
    ops = cpu.CpuStats()
    launch_stats = launches.LaunchStats()
    for r in results:
        comm.merge(r.collectives)
        ops.merge(r.cpu)
        launch_stats.merge(r.launches)
    all_syncs = [f for r in results for f in r.syncs]
    step_rows = [row for r in results for row in r.json["steps"]]
    if not step_rows:
        warnings.append("no ProfilerStep#n ranges: no per-step figures")
    if not gpu.kernel_count:
        warnings.append("no GPU kernels: a CPU-only trace, or GPU activity was not recorded")
    summary = {
        "schema_version": SCHEMA_VERSION,
        "source": {"path": str(path), "files": files},
        "headline": "",
        "gpu": kernels.to_json(gpu, top_n),
        "launches": launches.to_json(launch_stats),
        "gaps": gaps.summarize([r.gaps for r in results], top_n),
        "collectives": collectives.to_json(comm, top_n),
        "cpu": cpu.to_json(ops, top_n),
        "syncs": syncs.summarize(all_syncs),
        "steps": step_rows,
        "processes": [r.json for r in results],
        "warnings": warnings,
    }
    summary["headline"] = headline(summary)
    return summary


def headline(summary: dict) -> str:
    """One line for a capture's status: GPU busy, top kernel, syncs."""
    parts = []
    gpu = summary["gpu"]
    step_rows = summary["steps"]
    if gpu["kernel_count"]:
        parts.append(f"GPU busy {gpu['busy_fraction'] * 100:.0f}%")
        top = gpu["top_kernels"][0]
        parts.append(f"top kernel {short_name(top['name'])} ({top['fraction'] * 100:.0f}% of kernel time)")
    else:
        parts.append("CPU only")
        if summary["cpu"]["top_ops"]:
            parts.append(f"top op {summary['cpu']['top_ops'][0]['name']}")
    if step_rows:
        mean = sum(row["wall_us"] for row in step_rows) / len(step_rows)
        parts.append(f"{len(step_rows)} steps, {_ms(mean)}/step")
    count = sum(s["count"] for s in summary["syncs"])
    blocked = sum(s["total_us"] for s in summary["syncs"])
    parts.append(f"{count} syncs ({_ms(blocked)} blocked)" if count else "no syncs")
    return " · ".join(parts)


def short_name(name: str, width: int = 48) -> str:
    """A kernel's name without return type, template arguments and parameters."""
    text = name[5:] if name.startswith("void ") else name
    text = text.replace("(anonymous namespace)::", "")
    depth = 0
    out = []
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    short = "".join(out).strip() or text
    return short if len(short) <= width else short[: width - 1] + "…"


def _ms(value_us: float) -> str:
    return f"{value_us / 1000:.2f} ms" if value_us >= 1000 else f"{value_us:.0f} µs"


