"""The readable report: the summary dict as text for a terminal, most telling figures first."""

from __future__ import annotations

from .questions.ranks import format_ranks
from .questions.modules_text import format_modules
from .questions.anatomy import format_anatomy
from .summary import unique_short_names


def format_report(summary: dict, steps_shown: int = 20) -> str:
    lines: list[str] = []
    add = lines.append
    source = summary["source"]
    files = source["files"]
    events = sum(f["events"] for f in files)
    add(f"Trace: {source['path']} ({len(files)} file{'s' if len(files) != 1 else ''}, {events:,} events)")
    add(f"Summary: {summary['headline']}")
    for warning in summary.get("warnings", []):
        add(f"  note: {warning}")
    if summary.get("anatomy"):  # across processes: before each process's own figures
        add("")
        lines.extend(format_anatomy(summary["anatomy"], _t))
    for process in summary["processes"]:
        add("")
        add(f"== {process['label']} — {_t(process['window_us'])} captured")
        _process(process, add, steps_shown)
    if len(summary["processes"]) > 1:
        add("")
        add("== All processes")
        _gpu(summary["gpu"], add)
        _syncs(summary["syncs"], add)
    if summary.get("ranks"):
        add("")
        lines.extend(format_ranks(summary["ranks"], _t))
    if "modules" in summary:
        add("")
        lines.extend(format_modules(summary["modules"], _t))
    return "\n".join(lines) + "\n"


def _process(p: dict, add, steps_shown: int) -> None:
    if p["steps"]:
        add(f"Steps ({len(p['steps'])}):")
        cut = [s for s in p["steps"] if s.get("partial")]
        add(f"  {'step':>6} {'wall':>10} {'kernels':>8} {'kernel time':>12} {'GPU busy':>9} {'launches':>9} {'syncs':>6} {'gaps':>5}")
        for s in p["steps"][:steps_shown]:
            add(
                f"  {s['step']:>6} {_t(s['wall_us']):>10} {s['kernel_count']:>8} {_t(s['kernel_time_us']):>12} "
                f"{s['gpu_busy_fraction'] * 100:>8.1f}% {s['launch_count']:>9} {s['sync_count']:>6} {s['gap_count']:>5}"
                f"{'  cut off' if s.get('partial') else ''}"
            )
        if len(p["steps"]) > steps_shown:
            add(f"  ... {len(p['steps']) - steps_shown} more steps in --json")
        if cut:
            add("  cut off: the last range ends where recording stopped; left out of the mean step time")
    _gpu(p["gpu"], add)
    launches = p["launches"]
    if launches["count"]:
        add(f"Launches: {launches['count']:,} calls, {_t(launches['total_us'])} of CPU time (mean {_t(launches['mean_us'])})")
    gaps = p["gaps"]
    if gaps["count"]:
        causes = ", ".join(f"{cause} {v['count']:,} ({_t(v['total_us'])})" for cause, v in gaps["by_cause"].items() if v["count"])
        add(f"GPU idle gaps ≥ {gaps['min_gap_us']:g} µs: {gaps['count']:,}, {_t(gaps['total_us'])} — {causes}")
        for g in gaps["largest"][:5]:
            step = f" step {g['step']}" if g["step"] is not None else ""
            add(f"  {_t(g['dur_us']):>10} at {_t(g['at_us'])}{step}: {g['cause']}{' — ' + g['detail'] if g['detail'] else ''}")
    comm = p["collectives"]
    if comm["count"]:
        add(
            f"Collectives: {comm['count']:,} kernels, {_t(comm['time_us'])}; {comm['overlap_fraction'] * 100:.0f}% overlapped "
            f"with compute, {_t(comm['exposed_us'])} exposed"
        )
    _syncs(p["syncs"], add)
    cpu = p["cpu"]
    if cpu["top_ops"]:
        add("CPU ops by self time:")
        for op in cpu["top_ops"][:10]:
            add(f"  {_t(op['self_us']):>10} {op['count']:>7,}×  {op['name']}")


def _gpu(gpu: dict, add) -> None:
    if not gpu["kernel_count"]:
        add("GPU: no kernels in this trace")
        return
    add(
        f"GPU: busy {_t(gpu['busy_us'])} of {_t(gpu['span_us'])} ({gpu['busy_fraction'] * 100:.1f}%), "
        f"{gpu['kernel_count']:,} kernels, {_t(gpu['kernel_time_us'])} kernel time"
    )
    for dev in gpu["devices"]:
        streams = ", ".join(f"stream {s['stream']} {_t(s['busy_us'])}" for s in dev["streams"])
        owner = f" of {dev['process']}" if dev.get("process") else ""
        add(f"  device {dev['device']}{owner}: busy {dev['busy_fraction'] * 100:.1f}% — {streams}")
    add("Top kernels:")
    names = unique_short_names([k["name"] for k in gpu["top_kernels"]], 70)
    for k in gpu["top_kernels"]:
        add(f"  {_t(k['total_us']):>10} {k['fraction'] * 100:>5.1f}% {k['count']:>7,}×  mean {_t(k['mean_us']):>9}  {names[k['name']]}")
    if gpu["memcpy"]:
        copies = ", ".join(f"{label} {v['count']}× {_t(v['total_us'])}" for label, v in gpu["memcpy"].items())
        add(f"Memcpy/memset: {copies}")


def _syncs(syncs: list, add) -> None:
    if not syncs:
        add("Synchronisation: none found")
        return
    add("Synchronisation (host blocked on the GPU):")
    for s in syncs:
        extra = f", {s['after_dtoh_copy']} right after a DtoH copy" if s["after_dtoh_copy"] else ""
        add(f"  {s['name']} ({s['kind']}): {s['count']:,}×, {_t(s['total_us'])} blocked, GPU idle after {_t(s['gpu_idle_after_us'])}{extra}")
        for site in s["sites"][:3]:
            where = site["python"] or " > ".join(site["stack"][-3:]) or "no recorded op (outside every op and annotation)"
            add(f"      {site['count']:,}× in {where}")


def _t(value_us: float) -> str:
    """A duration for people: µs, ms or s."""
    if value_us >= 1_000_000:
        return f"{value_us / 1_000_000:.2f} s"
    if value_us >= 1000:
        return f"{value_us / 1000:.2f} ms"
    return f"{value_us:.1f} µs"
