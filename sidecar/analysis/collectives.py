"""Collective communication (NCCL / RCCL kernels) and how much of it overlaps computation.

Per device: the union of collective kernel intervals, the union of all other kernels, and their
intersection. ``overlap_fraction`` is the share of collective time during which some computation
kernel also ran: 1.0 means communication is fully hidden, 0.0 means the GPU did nothing else.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from . import intervals
from .events import Kind, is_collective
from .kernels import NameStat, ratio, top, us
from .processes import ProcessView


@dataclass
class CollectiveStats:
    kernels: dict[str, NameStat] = field(default_factory=dict)
    time: float = 0.0  # sum of collective kernel durations
    busy: float = 0.0  # union of collective intervals, summed over devices
    overlapped: float = 0.0  # part of that union during which a non-collective kernel ran

    def merge(self, other: "CollectiveStats") -> None:
        for name, stat in other.kernels.items():
            self.kernels.setdefault(name, NameStat()).merge(stat)
        self.time += other.time
        self.busy += other.busy
        self.overlapped += other.overlapped


def collective_stats(view: ProcessView) -> CollectiveStats:
    gpu = view.gpu
    names = view.data.names
    flags: dict[int, bool] = {}
    comm: dict[int, list[intervals.Interval]] = defaultdict(list)
    compute: dict[int, list[intervals.Interval]] = defaultdict(list)
    stats = CollectiveStats()
    for i in view.gpu_index:
        if gpu.kind[i] != Kind.KERNEL:
            continue
        nid = gpu.name[i]
        flag = flags.get(nid)
        if flag is None:
            flag = flags[nid] = is_collective(names[nid])
        start, dur = gpu.ts[i], gpu.dur[i]
        if flag:
            stats.kernels.setdefault(names[nid], NameStat()).add(dur)
            stats.time += dur
            comm[gpu.device[i]].append((start, start + dur))
        else:
            compute[gpu.device[i]].append((start, start + dur))
    for device, pairs in comm.items():
        comm_union = intervals.union(pairs)
        stats.busy += intervals.total(comm_union)
        stats.overlapped += intervals.total(intervals.intersect(comm_union, intervals.union(compute.get(device, ()))))
    return stats


def to_json(stats: CollectiveStats, top_n: int) -> dict:
    return {
        "count": sum(s.count for s in stats.kernels.values()),
        "time_us": us(stats.time),
        "busy_us": us(stats.busy),
        "overlapped_us": us(stats.overlapped),
        "overlap_fraction": ratio(stats.overlapped, stats.busy),
        "exposed_us": us(stats.busy - stats.overlapped),
        "top": top(stats.kernels, top_n, stats.time),
    }
