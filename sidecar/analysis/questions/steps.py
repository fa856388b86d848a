"""Per ``ProfilerStep#n``: wall time and the GPU work, launches, copies and syncs it issued.

GPU work belongs to the step during which the host *launched* it (via the correlation join), not
the one during which it ran: the GPU often runs behind the host, and an incident question is
"what did step n ask of the GPU". Work with no known launch falls back to its own start time.

A process's last step range may be cut off where recording stopped (a plain torch.profiler trace
stopped mid-step): ``partial_last`` judges it by its length. Not in a process whose trace says its
step ranges are whole (``whole_steps``): the sidecar's probe opens and closes them at step boundaries
only (sidecar/common/phases.py ``WHOLE_STEPS_KEY``), so its last range, which holds no idle time after its
step, is a step however short.
"""

from __future__ import annotations

import msgspec
from typing import Optional, Sequence

import numpy as np

from ...common import phases as phase_names
from . import intervals
from ..reader.arrays import distinct
from ..reader.events import Kind, is_collective
from .gaps import GapTable
from .kernels import groups_in_order, name_stats, ratio, us
from .launches import LaunchStats, launch_stats
from ..reader.view import ProcessView
from .syncs import SyncFinding


class StepStats(msgspec.Struct):
    number: int
    ts: float
    dur: float
    kernel_count: int = 0
    kernel_time: float = 0.0
    top_kernel: Optional[int] = None  # name id with the most kernel time in the step
    busy: float = 0  # union of the step's kernel intervals, summed over devices (int 0 when none, as sum([]))
    gpu_end: float = 0.0
    launches: LaunchStats = msgspec.field(default_factory=LaunchStats)
    copy_count: int = 0
    copy_time: float = 0.0
    collective_time: float = 0.0
    sync_count: int = 0
    sync_time: float = 0.0
    gap_count: int = 0
    gap_time: float = 0.0


def step_stats(view: ProcessView, launch_calls: tuple[np.ndarray, np.ndarray], syncs: Sequence[SyncFinding], gaps: GapTable) -> list[StepStats]:
    steps = [StepStats(s.number, s.ts, s.dur, gpu_end=s.ts + s.dur) for s in view.steps]
    if not steps:
        return []
    names = view.data.names
    n = len(steps)
    ts, dur, kind, name, device = view.columns("ts", "dur", "kind", "name", "device")
    step = view.step_indices(view.launch_ts)
    inside = step >= 0
    ends = np.full(n, -np.inf)
    np.maximum.at(ends, step[inside], (ts + dur)[inside])
    copy = inside & (kind != Kind.KERNEL)
    copy_count = np.bincount(step[copy], minlength=n)
    copy_time = np.bincount(step[copy], weights=dur[copy], minlength=n)
    kern = np.flatnonzero(inside & (kind == Kind.KERNEL))
    flags = {nid: is_collective(names[nid]) for nid in distinct(name[kern]).tolist()}
    comm = np.array([flags[x] for x in name[kern].tolist()], dtype=bool) if len(kern) else np.zeros(0, dtype=bool)
    k_step = step[kern]
    kernel_count = np.bincount(k_step, minlength=n)
    kernel_time = np.bincount(k_step, weights=dur[kern], minlength=n)
    collective_time = np.bincount(k_step[comm], weights=dur[kern][comm], minlength=n)
    for index, s in enumerate(steps):
        if ends[index] > s.gpu_end:
            s.gpu_end = float(ends[index])
        s.copy_count, s.copy_time = int(copy_count[index]), float(copy_time[index])
        s.kernel_count, s.kernel_time = int(kernel_count[index]), float(kernel_time[index])
        s.collective_time = float(collective_time[index])
    for (index,), rows in groups_in_order(k_step):
        rows = kern[rows]
        by_name = name_stats(name[rows], dur[rows])
        steps[index].top_kernel = max(by_name, key=lambda nid: by_name[nid].total)
        busy = 0
        for (_device,), part in groups_in_order(device[rows]):
            busy += intervals.total(intervals.union(ts[rows][part], (ts + dur)[rows][part]))
        steps[index].busy = busy
    l_ts, l_dur = launch_calls
    l_step = view.step_indices(l_ts)
    for index in distinct(l_step[l_step >= 0]).tolist():
        mine = l_dur[l_step == index]
        steps[index].launches = launch_stats(mine)
    for f in syncs:
        index = view.step_index_at(f.ts)
        if index >= 0:
            steps[index].sync_count += 1
            steps[index].sync_time += f.dur
    first_of = {}
    for index, s in enumerate(steps):
        first_of.setdefault(s.number, index)
    owner = np.array([first_of[s.number] for s in steps])[gaps.step_index] if len(gaps) else np.zeros(0, dtype=np.int64)
    known = gaps.step_index >= 0 if len(gaps) else np.zeros(0, dtype=bool)
    gap_count = np.bincount(owner[known], minlength=n)
    gap_time = np.bincount(owner[known], weights=gaps.dur[known], minlength=n)
    for index, s in enumerate(steps):
        s.gap_count, s.gap_time = int(gap_count[index]), float(gap_time[index])
    return steps


# A process's last ProfilerStep range ends where recording stopped, not where the next step began. Shorter
# than this fraction of the median of the others, it is taken as cut off, not as a fast step (unless the
# trace says its ranges are whole: ``whole_steps``).
PARTIAL_BELOW = 0.5


def whole_steps(view: ProcessView) -> bool:
    """Whether ``view``'s trace says none of the process's step ranges is cut off: a probe's own trace
    (``whole_steps``: true), or the sidecar's merged trace listing the process's pid
    (``whole_steps_pids``). Neither: a foreign trace, whose last range ``partial_last`` judges."""
    noted = view.data.members.get(phase_names.TRACE_MEMBER)
    if not isinstance(noted, dict):
        return False
    if noted.get(phase_names.WHOLE_STEPS_KEY) is True:
        return True
    pids = noted.get(phase_names.WHOLE_STEPS_PIDS_KEY)
    return isinstance(pids, list) and any(type(p) is type(view.pid) and p == view.pid for p in pids)


def partial_last(durations: Sequence[float]) -> bool:
    """Whether the last of a process's step ranges is cut off: under PARTIAL_BELOW of the others' median."""
    if len(durations) < 2:
        return False
    return durations[-1] < PARTIAL_BELOW * _median(durations[:-1])


def _median(values: Sequence[float]) -> float:
    """``np.median`` of a short list, to the bit (the mean of the middle two for an even count): its first
    call imports ``numpy.ma`` (numpy 2.3), about 7 ms of a ``sidecar analyze`` run."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def to_json(view: ProcessView, steps: Sequence[StepStats], window_start: float) -> list[dict]:
    names = view.data.names
    out = []
    cut_off = not whole_steps(view) and partial_last([s.dur for s in steps])
    for index, s in enumerate(steps):
        busy = s.busy
        span = s.gpu_end - s.ts
        top_id = s.top_kernel
        out.append(
            {
                "process": view.label,
                "pid": view.pid,
                "rank": view.rank,
                "step": s.number,
                "start_at_us": us(s.ts - window_start),
                "wall_us": us(s.dur),
                "partial": cut_off and index == len(steps) - 1,
                "kernel_count": s.kernel_count,
                "kernel_time_us": us(s.kernel_time),
                "gpu_busy_us": us(busy),
                "gpu_span_us": us(span),
                "gpu_busy_fraction": ratio(busy, span),
                "top_kernel": names[top_id] if top_id is not None else None,
                "launch_count": s.launches.count,
                "launch_us": us(s.launches.total),
                "memcpy_count": s.copy_count,
                "memcpy_us": us(s.copy_time),
                "collective_us": us(s.collective_time),
                "sync_count": s.sync_count,
                "sync_us": us(s.sync_time),
                "gap_count": s.gap_count,
                "gap_us": us(s.gap_time),
            }
        )
    return out
