"""``analyze_path``: a trace file or a folder of rank files in, the stable summary dict out.

Files are read one at a time and only each process's results are kept, so memory is bounded by
the largest single file's compact event arrays, never by the sum of the files. The dict layout is
documented field by field in docs/analysis.md; ``schema_version`` changes when a field changes
meaning or disappears (new fields may be added within a version).
"""

from __future__ import annotations

import os
from typing import Optional

import msgspec
from pathlib import Path

from .questions import collectives, cpu, gaps, kernels, launches, ranks, steps, syncs
from .questions import modules
from .questions import anatomy
from .reader import halves
from .reader.collect import Collector, TraceData
from .reader.errors import TraceFormatError
from .reader.processes import split_processes
from .reader.stream import TopLevel, read_events
from .reader.view import ProcessView

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
    ranks: ranks.RankPart | None = None  # what the comparison of ranks needs (questions/ranks.py); None without a rank
    module_stats: modules.ModuleStats | None = None  # time per nn.Module (questions/modules.py)
    anatomy: anatomy.AnatomyPart | None = None  # the process's phase ranges (questions/anatomy.py); None without


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


def load(path: str | os.PathLike, head: Optional[halves.Head] = None) -> TraceData:
    """Stream one trace file into compact arrays. ``head``: a reader of this file's head, forked by
    ``halves.start_head``; the result is the same."""
    if head is not None:
        data = halves.load(os.fspath(path), head)
        if data is not None:
            return data
    top = TopLevel()
    collector = Collector(str(path))
    for batch in read_events(str(path), top):
        collector.add(batch)
    return collector.finish(top.members, top.skipped_events)


def analyze_process(view: ProcessView, top_n: int) -> ProcessResult:
    return _with_anatomy(_analyze_process(view, top_n), view)


def _analyze_process(view: ProcessView, top_n: int) -> ProcessResult:
    window = view.window()
    gpu = kernels.gpu_stats(view, window)
    found_syncs = syncs.find_syncs(view)
    found_gaps = gaps.find_gaps(view, gpu, found_syncs, describe_top=top_n)
    found_syncs = gaps.attribute_idle(found_syncs, found_gaps)
    comm = collectives.collective_stats(view)
    ops = cpu.cpu_stats(view)
    launch_calls = launches.launches(view)
    launch_stats = launches.launch_stats(launch_calls[1])
    step_list = steps.step_stats(view, launch_calls, found_syncs, found_gaps)
    gap_part = gaps.part(view, found_gaps, window[0], top_n)
    module_part = modules.module_stats(view)
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
        # torch.profiler's own synchronize at stop, left out of "syncs": how long stopping waited
        # for the GPU work queued before it (null: none found).
        "profiler_stop_sync_us": _profiler_stop_us(view),
        "steps": steps.to_json(view, step_list, window[0]),
        "modules": modules.to_json(module_part, top_n),
    }
    return ProcessResult(view.label, gpu, comm, ops, launch_stats, found_syncs, gap_part, window, body,
                         ranks.rank_part(view, window), module_stats=module_part)


def _with_anatomy(result: ProcessResult, view: ProcessView) -> ProcessResult:
    result.anatomy = anatomy.process_part(view)
    return result


def _profiler_stop_us(view: ProcessView) -> float | None:
    found = syncs.profiler_stop_syncs(view)
    return kernels.us(sum(dur for _, _, dur in found)) if found else None


def analyze_path(path: str | os.PathLike, top_n: int = 10, *, all_names: bool = False,
                 head: Optional[halves.Head] = None) -> dict:
    """Analyse a trace file (.json or .json.gz, gzip detected by content) or a folder of rank
    files. Raises TraceFormatError for anything unreadable.

    ``all_names``: the top-level ``top_kernels``, ``top_ops`` and ``collectives.top`` list every name,
    not the first ``top_n``: what ``sidecar diff`` compares (a kernel that left one capture's top ten is
    still a figure to compare). The headline, the per-process lists and the largest gaps are unchanged.
    ``head``: a reader of the head of ``path`` (a file), forked by ``halves.start_head``; the caller
    cancels it after."""
    if top_n < 1:
        raise ValueError("top_n must be at least 1")
    files = []
    results: list[ProcessResult] = []
    warnings: list[str] = []
    for file in trace_files(path):
        data = load(file, head if head is not None and head.path == os.path.abspath(file) else None)
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
    return summarize_results(path, files, results, warnings, top_n, all_names)


def summarize_results(path, files: list[dict], results: list[ProcessResult], warnings: list[str], top_n: int,
                      all_names: bool = False) -> dict:
    """The summary of processes analysed one by one (``analyze_process``): what ``analyze_path`` returns,
    and what the sidecar builds from a merged trace read one process at a time (service/merged_analysis.py)."""
    gpu = kernels.merge((r.gpu for r in results), (r.view_label for r in results))
    comm = collectives.CollectiveStats()
    ops = cpu.CpuStats()
    launch_stats = launches.LaunchStats()
    for r in results:
        comm.merge(r.collectives)
        ops.merge(r.cpu)
        launch_stats.merge(r.launches)
    all_syncs = [f for r in results for f in r.syncs]
    module_total = modules.ModuleStats()
    for r in results:
        if r.module_stats is not None:
            module_total.merge(r.module_stats)
    step_rows = [row for r in results for row in r.json["steps"]]
    if not step_rows:
        warnings.append("no ProfilerStep#n ranges: no per-step figures")
    if not gpu.kernel_count:
        warnings.append("no GPU kernels: a CPU-only trace, or GPU activity was not recorded")
    warnings.extend(_rank_clashes(results))
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
        "modules": modules.to_json(module_total, top_n),
        "warnings": warnings,
    }
    side_by_side = ranks.summarize([(r.ranks, r.json) for r in results if r.ranks is not None])
    if side_by_side is not None:  # two ranks or more
        summary["ranks"] = side_by_side
    summary["anatomy"] = anatomy.summarize([r.anatomy for r in results if r.anatomy is not None])
    summary["headline"] = headline(summary)  # from the top_n lists: the same line as `sidecar analyze`'s
    if all_names:
        summary["gpu"]["top_kernels"] = kernels.top(gpu.kernels, len(gpu.kernels), gpu.kernel_time)
        summary["cpu"]["top_ops"] = cpu.to_json(ops, len(ops.ops))["top_ops"]
        summary["collectives"]["top"] = kernels.top(comm.kernels, len(comm.kernels), comm.time)
    return summary


def _rank_clashes(results: list[ProcessResult]) -> list[str]:
    """Two processes of different files that claim one rank: their figures are added up as they are,
    and when their windows do not even overlap their clocks are probably unrelated."""
    by_rank: dict[int, list[ProcessResult]] = {}
    for r in results:
        if r.json["rank"] is not None:
            by_rank.setdefault(r.json["rank"], []).append(r)
    out = []
    for rank, claims in sorted(by_rank.items()):
        files = sorted({Path(r.json["file"]).name for r in claims})
        if len(files) < 2:
            continue
        apart = any(a.window[1] < b.window[0] or b.window[1] < a.window[0] for a in claims for b in claims if a is not b)
        clocks = "; their windows do not overlap: unrelated clocks?" if apart else ""
        out.append(f"rank {rank} is claimed by {len(claims)} processes in {', '.join(files)}{clocks}")
    return out


def engine_step_rows(step_rows: list[dict]) -> tuple[int, list[dict]]:
    """(engine steps, the step rows of the processes that have that many).

    Every process of a capture (every rank of a folder) records the same engine steps, so the count is
    the most any one process has, not the markers of all processes added up (an API server's single
    window is no step)."""
    per_process: dict[tuple, list[dict]] = {}
    for row in step_rows:
        per_process.setdefault((row["process"], row["pid"]), []).append(row)
    count = max(len(rows) for rows in per_process.values())
    return count, [row for rows in per_process.values() if len(rows) == count for row in rows]


def engine_steps(step_rows: list[dict]) -> tuple[int, float | None, int]:
    """(engine steps, mean wall time of a complete one in µs, cut-off steps left out). The mean is
    over the complete steps of the processes that have the most (``engine_step_rows``)."""
    count, rows = engine_step_rows(step_rows)
    whole = [row["wall_us"] for row in rows if not row.get("partial")]
    mean = sum(whole) / len(whole) if whole else None
    return count, mean, len(rows) - len(whole)


def _percent(fraction: float) -> str:
    """As the report's body writes a share: one decimal."""
    return f"{fraction * 100:.1f}%"


def headline(summary: dict) -> str:
    """One line for a capture's status: GPU busy, top kernel, engine steps, largest phase, straggler
    rank (when ranks are compared), syncs. Its figures are the body's, written the same way."""
    parts = []
    gpu = summary["gpu"]
    step_rows = summary["steps"]
    if gpu["kernel_count"]:
        busy = f"GPU busy {_percent(gpu['busy_fraction'])}"
        devices = [d["busy_fraction"] for d in gpu["devices"]]
        if len(devices) > 1:
            busy += f" ({len(devices)} devices, {_percent(min(devices))}–{_percent(max(devices))})"
        parts.append(busy)
        top = gpu["top_kernels"][0]
        names = unique_short_names([k["name"] for k in gpu["top_kernels"]])
        parts.append(f"top kernel {names[top['name']]} ({_percent(top['fraction'])} of kernel time)")
    else:
        parts.append("CPU only")
        if summary["cpu"]["top_ops"]:
            parts.append(f"top op {summary['cpu']['top_ops'][0]['name']}")
    if step_rows:
        count, mean, cut = engine_steps(step_rows)
        text = f"{count} step{'' if count == 1 else 's'}"
        if mean is not None:
            text += f", {_ms(mean)}/step"
        if cut:
            text += f" ({cut} cut off, left out)"
        parts.append(text)
    largest = (summary.get("anatomy") or {}).get("largest")
    if largest is not None:  # step anatomy: what a step spends most of its time on
        parts.append(f"largest phase {largest['label']} ({_ms(largest['mean_us'])}/step, {largest['process']})")
    straggler = (summary.get("ranks") or {}).get("straggler")
    if straggler is not None:  # ranks side by side: the rank that arrives last most often
        parts.append(f"straggler rank {straggler['rank']} (+{_ms(straggler['late_by_mean_us'])})")
    count = sum(s["count"] for s in summary["syncs"])
    blocked = sum(s["total_us"] for s in summary["syncs"])
    parts.append(f"{count:,} sync{'' if count == 1 else 's'} ({_ms(blocked)} blocked)" if count else "no syncs")
    return " · ".join(parts)


def unique_short_names(names: list[str], width: int = 48) -> dict[str, str]:
    """``short_name`` of each, made distinct: names that shorten alike keep their template arguments,
    and any still alike get ``[1]``, ``[2]``, ... in the order given."""
    out = {n: short_name(n, width) for n in names}
    for pass_ in ("templates", "numbers"):
        seen: dict[str, list[str]] = {}
        for n in names:
            seen.setdefault(out[n], []).append(n)
        for group in (g for g in seen.values() if len(g) > 1):
            if pass_ == "templates":
                longer = [short_name(n, width, templates=True) for n in group]
                if len(set(longer)) == len(group):  # else the prefix that fits is still shared: number them
                    out.update(zip(group, longer))
                continue
            for i, n in enumerate(group, 1):
                tag = f" [{i}]"
                out[n] = out[n][: width - len(tag)] + tag if len(out[n]) + len(tag) > width else out[n] + tag
    return out



def short_name(name: str, width: int = 48, templates: bool = False) -> str:
    """A kernel's name without return type and parameters, and without its template arguments unless
    ``templates`` (what tells two instantiations of one kernel apart)."""
    text = name[5:] if name.startswith("void ") else name
    text = text.replace("(anonymous namespace)::", "")
    depth = 0
    out = []
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">" and depth:
            depth -= 1
            if templates:
                out.append(ch)
            continue
        if ch == "(" and depth == 0:
            break
        if depth == 0 or templates:
            out.append(ch)
    short = "".join(out).strip() or text
    return short if len(short) <= width else short[: width - 1] + "…"


def _ms(value_us: float) -> str:
    return f"{value_us / 1000:.2f} ms" if value_us >= 1000 else f"{value_us:.0f} µs"


