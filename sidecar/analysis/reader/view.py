"""A process of a trace file (``ProcessView``): its host threads, its steps, and the GPU work it launched.

``processes.py`` splits a trace into views and ``ownership.py`` fills in which GPU activity each
view launched; both need the view, so it lives here, below both of them. Every analysis reads a
trace through views.
"""

from __future__ import annotations

import re
from typing import Optional

import msgspec
import numpy as np

from .collect import GpuActivities, HostThread, Pid, StepMark, TraceData
from .events import STEP_PREFIX, Kind
from .nesting import ThreadTree, build_tree

RANK_IN_LABEL = re.compile(r"\brank\s*(\d+)", re.IGNORECASE)
_NO_INT = np.zeros(0, dtype=np.int64)


class ProcessView(msgspec.Struct):
    """One process (or rank) of a trace file, with the GPU work it launched."""

    data: TraceData
    pid: Pid
    label: str
    rank: Optional[int]
    threads: dict[Pid, HostThread]
    gpu_index: np.ndarray = msgspec.field(default_factory=lambda: _NO_INT)  # indices into data.gpu, ascending
    launch_thread: np.ndarray = msgspec.field(default_factory=lambda: _NO_INT)  # per activity: index into tids, -1 unknown
    launch_index: np.ndarray = msgspec.field(default_factory=lambda: _NO_INT)  # index in that thread, or -1
    launch_ts: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0))  # host time of the launch (own start if unknown)
    steps: list[StepMark] = msgspec.field(default_factory=list)
    _trees: dict[Pid, ThreadTree] = msgspec.field(default_factory=dict)
    _runtime: dict[Pid, np.ndarray] = msgspec.field(default_factory=dict)

    @property
    def gpu(self) -> GpuActivities:
        return self.data.gpu  # type: ignore[return-value]

    @property
    def tids(self) -> list[Pid]:
        return list(self.threads)

    def launch_tid(self, k: int) -> Optional[Pid]:
        """The thread that launched activity ``k`` of this process, None when unknown."""
        t = int(self.launch_thread[k])
        return self.tids[t] if t >= 0 else None

    def columns(self, *names: str) -> tuple[np.ndarray, ...]:
        """This process's GPU activities' columns (``ts``, ``dur``, ``kind``, ...), in order."""
        return tuple(getattr(self.gpu, n)[self.gpu_index] for n in names)

    def runtime_calls(self, tid: Pid) -> np.ndarray:
        """Indices of the runtime/driver calls of thread ``tid``, in time order (cached)."""
        found = self._runtime.get(tid)
        if found is None:
            thread = self.threads[tid]
            calls = np.flatnonzero(thread.kind == Kind.RUNTIME)
            found = self._runtime[tid] = calls[np.argsort(thread.ts[calls], kind="stable")]
        return found

    def tree(self, tid: Pid) -> ThreadTree:
        tree = self._trees.get(tid)
        if tree is None:
            tree = self._trees[tid] = build_tree(self.threads[tid])
        return tree

    def step_indices(self, t: np.ndarray) -> np.ndarray:
        """Per host time: the index in ``steps`` of the ProfilerStep running then, -1 if none."""
        if not self.steps:
            return np.full(len(t), -1, dtype=np.int64)
        starts = np.array([s.ts for s in self.steps])
        ends = np.array([s.ts + s.dur for s in self.steps])
        k = np.searchsorted(starts, t, side="right") - 1
        inside = (k >= 0) & (t <= ends[np.maximum(k, 0)])
        return np.where(inside, k, -1)

    def step_index_at(self, t: float) -> int:
        return int(self.step_indices(np.array([t]))[0])

    def step_at(self, t: float) -> Optional[int]:
        """The number n of the ``ProfilerStep#n`` running at host time ``t``, if any."""
        k = self.step_index_at(t)
        return self.steps[k].number if k >= 0 else None

    def enclosing(self, tid: Pid, index: int, depth: int = 12) -> tuple[str, str, tuple[str, ...]]:
        """What host event ``index`` of thread ``tid`` ran inside: (innermost cpu_op or
        user_annotation, innermost python_function frame, enclosing names outermost first).
        ProfilerStep ranges are left out: every event of a step is inside one."""
        thread = self.threads[tid]
        names = self.data.names
        site = python = ""
        stack = []
        for p in self.tree(tid).ancestors(int(index)):  # innermost first
            pname = names[thread.name[p]]
            kind = thread.kind[p]
            if kind == Kind.ANNOTATION and pname.startswith(STEP_PREFIX):
                continue
            stack.append(pname)
            if not site and kind in (Kind.OP, Kind.ANNOTATION):
                site = pname
            if not python and kind == Kind.PYTHON:
                python = pname
        return site, python, tuple(reversed(stack[:depth]))

    def window(self) -> tuple[float, float]:
        """First start to last end over this process's host events and GPU activities."""
        starts: list[float] = []
        ends: list[float] = []
        for thread in self.threads.values():
            if len(thread.ts):
                starts.append(float(thread.ts.min()))
                ends.append(float((thread.ts + thread.dur).max()))
        if len(self.gpu_index):
            ts, dur = self.columns("ts", "dur")
            starts.append(float(ts.min()))
            ends.append(float((ts + dur).max()))
        if not starts:
            return (0.0, 0.0)
        return (min(starts), max(ends))


def track_view(data: TraceData, views: dict[Pid, ProcessView], track: int, device: int) -> Pid:
    """The pseudo-process of a GPU track with no known launches (a GPU-only trace)."""
    track_pid = data.tracks[track]
    key = ("gpu-track", track_pid)
    if key not in views:
        label = data.process_names.get(track_pid) or f"GPU {device}"
        rank = RANK_IN_LABEL.search(label)
        views[key] = ProcessView(
            data=data, pid=f"track {track_pid}", label=f"{label} (no host events)", rank=int(rank.group(1)) if rank else None, threads={}
        )
    return key
