"""Per ``ProfilerStep#n``: wall time and the GPU work, launches, copies and syncs it issued.

GPU work belongs to the step during which the host *launched* it (via the correlation join), not
the one during which it ran: the GPU often runs behind the host, and an incident question is
"what did step n ask of the GPU". Work with no known launch falls back to its own start time.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Sequence

from . import intervals
from .events import Kind, is_collective
from .gaps import Gap
from .kernels import ratio, us
from .launches import Launch, LaunchStats
from .processes import ProcessView
from .syncs import SyncFinding


@dataclass
class StepStats:
    number: int
    ts: float
    dur: float
    kernel_count: int = 0
    kernel_time: float = 0.0
    kernel_by_name: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    busy_pairs: dict[int, list] = field(default_factory=lambda: defaultdict(list))
    gpu_end: float = 0.0
    launches: LaunchStats = field(default_factory=LaunchStats)
    copy_count: int = 0
    copy_time: float = 0.0
    collective_time: float = 0.0
    sync_count: int = 0
    sync_time: float = 0.0
    gap_count: int = 0
    gap_time: float = 0.0


def step_stats(view: ProcessView, launch_list: Sequence[Launch], syncs: Sequence[SyncFinding], gaps: Sequence[Gap]) -> list[StepStats]:
    steps = [StepStats(s.number, s.ts, s.dur, gpu_end=s.ts + s.dur) for s in view.steps]
    if not steps:
        return []
    gpu = view.gpu
    names = view.data.names
    collective: dict[int, bool] = {}
    for k, i in enumerate(view.gpu_index):
        index = view.step_index_at(view.launch_ts[k])
        if index < 0:
            continue
        step = steps[index]
        start, dur = gpu.ts[i], gpu.dur[i]
        if start + dur > step.gpu_end:
            step.gpu_end = start + dur
        if gpu.kind[i] != Kind.KERNEL:
            step.copy_count += 1
            step.copy_time += dur
            continue
        nid = gpu.name[i]
        step.kernel_count += 1
        step.kernel_time += dur
        step.kernel_by_name[nid] += dur
        step.busy_pairs[gpu.device[i]].append((start, start + dur))
        flag = collective.get(nid)
        if flag is None:
            flag = collective[nid] = is_collective(names[nid])
        if flag:
            step.collective_time += dur
    for launch in launch_list:
        index = view.step_index_at(launch.ts)
        if index >= 0:
            steps[index].launches.add(launch.dur)
    for f in syncs:
        index = view.step_index_at(f.ts)
        if index >= 0:
            steps[index].sync_count += 1
            steps[index].sync_time += f.dur
    by_number = {step.number: step for step in reversed(steps)}
    for gap in gaps:
        owner = by_number.get(gap.step) if gap.step is not None else None
        if owner is not None:
            owner.gap_count += 1
            owner.gap_time += gap.dur
    return steps


def to_json(view: ProcessView, steps: Sequence[StepStats], window_start: float) -> list[dict]:
    names = view.data.names
    out = []
    for s in steps:
        busy = sum(intervals.total(intervals.union(pairs)) for pairs in s.busy_pairs.values())
        span = s.gpu_end - s.ts
        top_id = max(s.kernel_by_name, key=s.kernel_by_name.__getitem__) if s.kernel_by_name else None
        out.append(
            {
                "process": view.label,
                "pid": view.pid,
                "rank": view.rank,
                "step": s.number,
                "start_at_us": us(s.ts - window_start),
                "wall_us": us(s.dur),
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
