"""CPU operators by self time: duration minus the time of the events directly inside them
(child ops, runtime calls, Python frames), the way ``key_averages`` counts "Self CPU"."""

from __future__ import annotations

import msgspec

import numpy as np

from ..reader.arrays import groups
from ..reader.events import Kind
from .kernels import us
from ..reader.view import ProcessView


class OpStat(msgspec.Struct):
    count: int = 0
    total: float = 0.0
    self_time: float = 0.0

    def merge(self, other: "OpStat") -> None:
        self.count += other.count
        self.total += other.total
        self.self_time += other.self_time


class CpuStats(msgspec.Struct):
    ops: dict[str, OpStat] = msgspec.field(default_factory=dict)
    threads: int = 0

    def merge(self, other: "CpuStats") -> None:
        for name, stat in other.ops.items():
            self.ops.setdefault(name, OpStat()).merge(stat)
        self.threads += other.threads


def cpu_stats(view: ProcessView) -> CpuStats:
    """Per op name: count, total and self time, summed over threads in thread order and events
    in file order, as the per-event loop did (bincount adds in input order)."""
    name_parts, dur_parts, own_parts = [], [], []
    for tid, thread in view.threads.items():
        ops = np.flatnonzero(thread.kind == Kind.OP)
        if not len(ops):
            continue
        dur = thread.dur[ops]
        own = dur - view.tree(tid).child_time[ops]
        name_parts.append(thread.name[ops])
        dur_parts.append(dur)
        own_parts.append(np.where(own > 0.0, own, 0.0))
    names = view.data.names
    stats = CpuStats(threads=len(view.threads))
    if not name_parts:
        return stats
    name, dur, own = np.concatenate(name_parts), np.concatenate(dur_parts), np.concatenate(own_parts)
    uniq, first, inverse = groups(name)
    counts = np.bincount(inverse, minlength=len(uniq))
    totals = np.bincount(inverse, weights=dur, minlength=len(uniq))
    selfs = np.bincount(inverse, weights=own, minlength=len(uniq))
    for g in np.argsort(first, kind="stable").tolist():
        stats.ops[names[uniq[g]]] = OpStat(int(counts[g]), float(totals[g]), float(selfs[g]))
    return stats


def to_json(stats: CpuStats, top_n: int) -> dict:
    ranked = sorted(stats.ops.items(), key=lambda item: (-item[1].self_time, item[0]))[:top_n]
    return {
        "op_count": sum(s.count for s in stats.ops.values()),
        "self_time_us": us(sum(s.self_time for s in stats.ops.values())),
        "threads": stats.threads,
        "top_ops": [
            {"name": name, "count": s.count, "self_us": us(s.self_time), "total_us": us(s.total), "mean_self_us": us(s.self_time / s.count)}
            for name, s in ranked
        ],
    }
