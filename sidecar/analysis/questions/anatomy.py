"""Step anatomy: per engine step, per process, the time in each phase, and the time between forwards.

A capture's processes record named ranges for their phases (schedule, forward, sample, ...), and each
trace says which of its ranges are phases: the top-level ``inference_sidecar.phase_ranges`` member
(sidecar/common/phases.py), written by the probe from its engine profile and kept by the merge. A trace
without it has no anatomy: nothing here names an engine or guesses from range names.

- **A phase's time in a step** is the union of that phase's ranges (nested or repeated ranges of one
  phase count once) within the step's ``ProfilerStep#n`` range, over every thread of the process.
- **A process without steps** (an API server, which records a time window: one ``ProfilerStep#0``
  over all of it, or none) has its phases cut by the steps of the process of the same file with the
  most steps: what it did during each engine step. Its time outside every step is reported apart.
- **Partial steps.** A process's last step is partial when its range is cut off (``steps.partial_last``:
  under half the median of the others) or when it lacks a phase that every other step of the process
  has (the window ended inside it). A partial step is listed, marked, and left out of every mean.
  Neither rule applies to a process whose trace says its step ranges are whole (``steps.whole_steps``:
  the sidecar's probe opens and closes them at step boundaries only): none of its steps is partial.
- **Between forwards**: in a process with forward ranges, from the end of step n-1's last forward
  range to the start of step n's first, on the host: the time the model (on CPU, the worker) waits
  for the next batch. With GPU kernels, ``device_idle_us`` is the part of the time between the last
  kernel launched by step n-1's forward and the first launched by step n's during which none of the
  process's kernels ran.

Cheap where it does not apply: a trace without the member costs one dict lookup per process.
"""

from __future__ import annotations

from typing import Any, Optional

import msgspec
import numpy as np

from ...common import phases as phase_names
from . import intervals
from ..reader.events import Kind
from .kernels import us
from .steps import partial_last, whole_steps
from ..reader.view import ProcessView


class AnatomyPart(msgspec.Struct):
    """One process's phase ranges and steps: what ``summarize`` needs from it."""

    label: str
    pid: Any
    rank: Optional[int]
    file: str
    phases: dict[str, intervals.Spans]  # phase -> union of its ranges, in the process's clock
    steps: list[tuple[int, float, float]]  # (n, start, end) of the process's own ProfilerStep#n
    partial: list[bool]  # per own step
    between: list[dict]  # rows of the time between forwards (own steps only)


def phase_table(view: ProcessView) -> dict[str, str]:
    """The trace's range name → phase (known phases only); empty when the trace has none."""
    noted = view.data.members.get(phase_names.TRACE_MEMBER)
    table = noted.get(phase_names.PHASE_RANGES_KEY) if isinstance(noted, dict) else None
    if not isinstance(table, dict):
        return {}
    return {k: v for k, v in table.items() if isinstance(k, str) and v in phase_names.PHASE_NAMES}


def process_part(view: ProcessView) -> Optional[AnatomyPart]:
    """``view``'s phases; None when the trace notes no phase ranges or this process recorded none."""
    table = phase_table(view)
    if not table:
        return None
    names = view.data.names
    phase_of_id = {i: table[n] for i, n in enumerate(names) if n in table}
    if not phase_of_id:
        return None
    ids = np.fromiter(phase_of_id, dtype=np.int64, count=len(phase_of_id))
    starts: dict[str, list[np.ndarray]] = {}
    ends: dict[str, list[np.ndarray]] = {}
    for thread in view.threads.values():
        rows = np.flatnonzero((thread.kind == Kind.ANNOTATION) & np.isin(thread.name, ids))
        for nid in np.unique(thread.name[rows]).tolist():
            mine = rows[thread.name[rows] == nid]
            phase = phase_of_id[nid]
            starts.setdefault(phase, []).append(thread.ts[mine])
            ends.setdefault(phase, []).append(thread.ts[mine] + thread.dur[mine])
    if not starts:
        return None
    spans = {p: intervals.union(np.concatenate(starts[p]), np.concatenate(ends[p])) for p in starts}
    steps = [(s.number, s.ts, s.ts + s.dur) for s in view.steps]
    partial = [False] * len(steps) if whole_steps(view) else _partial_steps(steps, spans)
    return AnatomyPart(label=view.label, pid=view.pid, rank=view.rank, file=view.data.path, phases=spans,
                       steps=steps, partial=partial, between=_between_forwards(view, steps, partial, spans))


def _in_steps(spans: intervals.Spans, steps: list[tuple[int, float, float]]) -> np.ndarray:
    lo = np.array([s[1] for s in steps])
    hi = np.array([s[2] for s in steps])
    return intervals.covered(spans, lo, hi)


def _partial_steps(steps: list[tuple[int, float, float]], spans: dict[str, intervals.Spans]) -> list[bool]:
    partial = [False] * len(steps)
    if len(steps) < 2:
        return partial
    cut = partial_last([end - start for _, start, end in steps])
    if not cut:
        # A phase every earlier step has, missing from the last: the window ended inside it.
        for phase_spans in spans.values():
            seen = _in_steps(phase_spans, steps) > 0
            if seen[:-1].all() and not seen[-1]:
                cut = True
                break
    partial[-1] = cut
    return partial


def _forward_edges(forward: intervals.Spans, start: float, end: float) -> Optional[tuple[float, float]]:
    """(first forward start, last forward end) within [start, end]; None without a forward there."""
    first = int(np.searchsorted(forward.end, start, side="right"))
    last = int(np.searchsorted(forward.start, end, side="left")) - 1
    if first > last:
        return None
    return max(float(forward.start[first]), start), min(float(forward.end[last]), end)


def _between_forwards(view: ProcessView, steps, partial, spans) -> list[dict]:
    forward = spans.get(phase_names.FORWARD_PHASE)
    if forward is None or len(steps) < 2:
        return []
    edges = [_forward_edges(forward, start, end) for _, start, end in steps]
    device = _device_edges(view, forward, steps)
    rows = []
    for k in range(1, len(steps)):
        before, after = edges[k - 1], edges[k]
        if before is None or after is None:
            continue
        idle = None
        if device is not None and device[k - 1] is not None and device[k] is not None:
            busy, (a, b) = device[-1], (device[k - 1][1], device[k][0])
            idle = max(b - a, 0.0) - (float(intervals.covered(busy, np.array([a]), np.array([b]))[0]) if b > a else 0.0)
        rows.append({"step": steps[k][0], "host_us": us(max(after[0] - before[1], 0.0)),
                     "device_idle_us": None if idle is None else us(max(idle, 0.0)),
                     "partial": partial[k - 1] or partial[k]})
    return rows


def _device_edges(view: ProcessView, forward: intervals.Spans, steps) -> Optional[list]:
    """Per step: (first start, last end) of the kernels its forward ranges launched, or None; the
    list ends with the union of all the process's kernels. None: the process ran no kernels."""
    if not len(view.gpu_index):
        return None
    ts, dur, kind = view.columns("ts", "dur", "kind")
    kernels = kind == Kind.KERNEL
    if not kernels.any():
        return None
    ts, end, launch = ts[kernels], (ts + dur)[kernels], view.launch_ts[kernels]
    k = np.searchsorted(forward.start, launch, side="right") - 1
    in_forward = (k >= 0) & (launch <= forward.end[np.maximum(k, 0)])
    out: list = []
    for _, start, stop in steps:
        mine = in_forward & (launch >= start) & (launch <= stop)
        out.append((float(ts[mine].min()), float(end[mine].max())) if mine.any() else None)
    out.append(intervals.union(ts, end))
    return out


def _mean(values: list[float]) -> Optional[float]:
    return us(sum(values) / len(values)) if values else None


def _process_json(part: AnatomyPart, steps, partial, steps_of: Optional[str]) -> dict:
    order = [name for name, _ in phase_names.PHASES if name in part.phases]
    per_phase = {p: _in_steps(part.phases[p], steps) if steps else np.zeros(0) for p in order}
    rows = []
    for k, (number, start, end) in enumerate(steps):
        times = {p: float(per_phase[p][k]) for p in order}
        rows.append({"step": number, "partial": bool(partial[k]), "wall_us": us(end - start),
                     "phases_us": {p: us(t) for p, t in times.items()},
                     "unphased_us": us(max(end - start - sum(times.values()), 0.0))})
    complete = [k for k in range(len(steps)) if not partial[k]]
    return {
        "process": part.label, "pid": part.pid, "rank": part.rank, "steps_of": steps_of,
        "complete_steps": len(complete), "partial_steps": len(steps) - len(complete),
        "mean_us": {p: _mean([float(per_phase[p][k]) for k in complete]) for p in order},
        "total_us": {p: us(intervals.total(part.phases[p])) for p in order},
        "steps": rows,
    }


def summarize(parts: list[AnatomyPart]) -> Optional[dict]:
    """The summary's ``anatomy`` (docs/analysis.md); None when no process recorded phase ranges."""
    if not parts:
        return None
    processes = []
    for part in parts:
        # A window's one range (torch's ProfilerStep#0 over an API server's whole window) is no step.
        ref = max((p for p in parts if p.file == part.file and len(p.steps) > 1), key=lambda p: len(p.steps), default=None)
        if len(part.steps) > 1 or ref is None:
            processes.append(_process_json(part, part.steps, part.partial, None))
        else:
            processes.append(_process_json(part, ref.steps, ref.partial, ref.label))
    between = []
    for part in parts:
        if not part.between:
            continue
        whole = [r for r in part.between if not r["partial"]]
        idle = [r["device_idle_us"] for r in whole if r["device_idle_us"] is not None]
        between.append({"process": part.label, "pid": part.pid, "rank": part.rank,
                        "mean_host_us": _mean([r["host_us"] for r in whole]),
                        "mean_device_idle_us": _mean(idle), "steps": part.between})
    seen = {p for part in parts for p in part.phases}
    return {
        "phases": {name: text for name, text in phase_names.PHASES if name in seen},
        "processes": processes,
        "between_forwards": between,
        "largest": _largest(processes),
    }


def _largest(processes: list[dict]) -> Optional[dict]:
    """The phase with the most mean time per complete step in any process, waiting phases left out."""
    best = None
    for p in processes:
        for phase, mean in p["mean_us"].items():
            if mean is None or phase in phase_names.WAITING_PHASES:
                continue
            if best is None or mean > best["mean_us"]:
                best = {"process": p["process"], "phase": phase, "label": phase_names.label(phase), "mean_us": mean}
    return best


def format_anatomy(anatomy: Optional[dict], duration) -> list[str]:
    """The report's section: mean time per complete step in each phase, per process; between forwards."""
    if not anatomy:
        return []
    labels = anatomy["phases"]
    lines = ["== Step anatomy (mean per complete step; partial steps left out)"]
    for p in anatomy["processes"]:
        cut = f", {p['partial_steps']} partial" if p["partial_steps"] else ""
        basis = f" (during the steps of {p['steps_of']})" if p["steps_of"] else ""
        lines.append(f"{p['process']}{basis}: {p['complete_steps']} complete step{'' if p['complete_steps'] == 1 else 's'}{cut}")
        for phase, mean in p["mean_us"].items():
            shown = duration(mean) if mean is not None else "—"
            lines.append(f"  {labels[phase]:<22} {shown:>10}   total {duration(p['total_us'][phase])}")
    for b in anatomy["between_forwards"]:
        if b["mean_host_us"] is None:
            continue
        idle = f"; device idle {duration(b['mean_device_idle_us'])}" if b["mean_device_idle_us"] is not None else ""
        lines.append(f"Between two forwards in {b['process']}: {duration(b['mean_host_us'])} on the host{idle} (mean)")
    largest = anatomy["largest"]
    if largest is not None:
        lines.append(f"Largest phase: {largest['label']} in {largest['process']}, {duration(largest['mean_us'])} per step")
    return lines
