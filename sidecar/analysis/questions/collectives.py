"""Collective communication (NCCL / RCCL kernels) and how much of it overlaps computation.

Per device: the union of collective kernel intervals, the union of all other kernels, and their
intersection. ``overlap_fraction`` is the share of collective time during which some computation
kernel also ran: 1.0 means communication is fully hidden, 0.0 means the GPU did nothing else.
"""

from __future__ import annotations

import msgspec

import numpy as np

from . import intervals
from ..reader.arrays import distinct
from ..reader.events import Kind, is_collective
from .kernels import NameStat, name_stats, ratio, top, us
from ..reader.view import ProcessView


class CollectiveStats(msgspec.Struct):
    kernels: dict[str, NameStat] = msgspec.field(default_factory=dict)
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
    names = view.data.names
    ts, dur, kind, name, device = view.columns("ts", "dur", "kind", "name", "device")
    k = kind == Kind.KERNEL
    ts, dur, name, device = ts[k], dur[k], name[k], device[k]
    flags = {nid: is_collective(names[nid]) for nid in distinct(name).tolist()}
    comm = np.array([flags[n] for n in name.tolist()], dtype=bool) if len(name) else np.zeros(0, dtype=bool)
    stats = CollectiveStats()
    for nid, stat in name_stats(name[comm], dur[comm]).items():
        stats.kernels[names[nid]] = stat
    stats.time = intervals.seq_sum(dur[comm])
    end = ts + dur
    for device_id in dict.fromkeys(device[comm].tolist()):  # devices in order of first collective
        mine = device == device_id
        comm_union = intervals.union(ts[mine & comm], end[mine & comm])
        stats.busy += intervals.total(comm_union)
        compute = intervals.union(ts[mine & ~comm], end[mine & ~comm])
        stats.overlapped += intervals.total(intervals.intersect(comm_union, compute))
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
