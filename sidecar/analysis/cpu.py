"""CPU operators by self time: duration minus the time of the events directly inside them
(child ops, runtime calls, Python frames), the way ``key_averages`` counts "Self CPU"."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import compress

from .events import Kind
from .kernels import us
from .processes import ProcessView


@dataclass
class OpStat:
    count: int = 0
    total: float = 0.0
    self_time: float = 0.0

    def merge(self, other: "OpStat") -> None:
        self.count += other.count
        self.total += other.total
        self.self_time += other.self_time


@dataclass
class CpuStats:
    ops: dict[str, OpStat] = field(default_factory=dict)
    threads: int = 0

    def merge(self, other: "CpuStats") -> None:
        for name, stat in other.ops.items():
            self.ops.setdefault(name, OpStat()).merge(stat)
        self.threads += other.threads


def cpu_stats(view: ProcessView) -> CpuStats:
    by_id: dict[int, OpStat] = defaultdict(OpStat)
    for tid, thread in view.threads.items():
        tree = view.tree(tid)
        child_time, dur, name = tree.child_time, thread.dur, thread.name
        for i in compress(range(len(thread.kind)), map(int(Kind.OP).__eq__, thread.kind)):
            stat = by_id[name[i]]
            d = dur[i]
            own = d - child_time[i]
            stat.count += 1
            stat.total += d
            stat.self_time += own if own > 0.0 else 0.0
    names = view.data.names
    return CpuStats(ops={names[nid]: stat for nid, stat in by_id.items()}, threads=len(view.threads))


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
