"""Kernel launch calls on the host: how many, and how much CPU time they took.

A launch call is any runtime/driver call that puts work on the GPU (events.is_launch):
cudaLaunchKernel, cuLaunchKernel, cudaLaunchKernelExC, cudaGraphLaunch, hipLaunchKernel, ...
A graph launch counts once however many kernels it starts, which is the point of CUDA graphs.
"""

from __future__ import annotations

import msgspec

import numpy as np

from . import intervals
from ..reader.arrays import distinct
from ..reader.events import is_launch
from .kernels import us
from ..reader.view import ProcessView


class LaunchStats(msgspec.Struct):
    count: int = 0
    total: float = 0.0
    max: float = 0.0

    def add(self, dur: float) -> None:
        self.count += 1
        self.total += dur
        if dur > self.max:
            self.max = dur

    def merge(self, other: "LaunchStats") -> None:
        self.count += other.count
        self.total += other.total
        self.max = max(self.max, other.max)


def launches(view: ProcessView) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) of every launch call of the process: threads in order, each thread's
    calls in time order."""
    names = view.data.names
    flags: dict[int, bool] = {}
    starts, durs = [], []
    for tid, thread in view.threads.items():
        calls = view.runtime_calls(tid)
        ids = thread.name[calls]
        for nid in distinct(ids).tolist():
            if nid not in flags:
                flags[nid] = is_launch(names[nid])
        keep = calls[np.array([flags[n] for n in ids.tolist()], dtype=bool)] if len(calls) else calls
        starts.append(thread.ts[keep])
        durs.append(thread.dur[keep])
    if not starts:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(starts), np.concatenate(durs)


def launch_stats(durs: np.ndarray) -> "LaunchStats":
    return LaunchStats(len(durs), intervals.seq_sum(durs), float(durs.max()) if len(durs) else 0.0)


def to_json(stats: LaunchStats) -> dict:
    return {
        "count": stats.count,
        "total_us": us(stats.total),
        "mean_us": us(stats.total / stats.count) if stats.count else 0.0,
        "max_us": us(stats.max),
    }
