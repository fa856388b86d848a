"""Kernel launch calls on the host: how many, and how much CPU time they took.

A launch call is any runtime/driver call that puts work on the GPU (events.is_launch):
cudaLaunchKernel, cuLaunchKernel, cudaLaunchKernelExC, cudaGraphLaunch, hipLaunchKernel, ...
A graph launch counts once however many kernels it starts, which is the point of CUDA graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .events import is_launch
from .kernels import us
from .processes import ProcessView


@dataclass(frozen=True)
class Launch:
    ts: float
    dur: float


@dataclass
class LaunchStats:
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


def launches(view: ProcessView) -> Iterator[Launch]:
    names = view.data.names
    flags: dict[int, bool] = {}
    for tid, thread in view.threads.items():
        for i in view.runtime_calls(tid):
            nid = thread.name[i]
            flag = flags.get(nid)
            if flag is None:
                flag = flags[nid] = is_launch(names[nid])
            if flag:
                yield Launch(thread.ts[i], thread.dur[i])


def to_json(stats: LaunchStats) -> dict:
    return {
        "count": stats.count,
        "total_us": us(stats.total),
        "mean_us": us(stats.total / stats.count) if stats.count else 0.0,
        "max_us": us(stats.max),
    }
