"""Split one trace file into processes and tie each GPU activity to the host call that issued it.

In a Kineto trace GPU events sit under a pid equal to the device index, not under the process that
launched them; the link is the ``correlation`` id shared by the kernel and its runtime call
(cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch, ...). Joining on it gives each activity its
process, launching thread and launch time. Correlation ids are unique within one process; when a
merged trace repeats one across processes, the launch that came last before the kernel wins.
Activities with no matching launch go to the process that issued most of the work on that device.
The join itself is a sorted search over numpy columns (ownership.py); this module holds the view.
"""

from __future__ import annotations

import re
from collections import defaultdict
import msgspec
from typing import Optional

import numpy as np

from .collect import GpuActivities, HostThread, Pid, StepMark, TraceData
from .events import STEP_PREFIX, Kind
from .nesting import ThreadTree, build_tree

_RANK_IN_LABEL = re.compile(r"\brank\s*(\d+)", re.IGNORECASE)
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


def split_processes(data: TraceData, file_label: Optional[str] = None) -> list[ProcessView]:
    """The processes of one trace file, host processes first, in pid order of appearance."""
    from .ownership import assign_gpu  # the join needs ProcessView; imported here to avoid a cycle

    by_pid: dict[Pid, dict[Pid, HostThread]] = defaultdict(dict)
    for (pid, tid), thread in data.threads.items():
        by_pid[pid][tid] = thread
    file_rank = _file_rank(data)
    views: dict[Pid, ProcessView] = {}
    for pid, threads in by_pid.items():
        label, rank = _label(data, pid, file_rank)
        views[pid] = ProcessView(data=data, pid=pid, label=label, rank=rank, threads=threads)
    for step in sorted(data.steps, key=lambda s: (s.ts, s.number)):
        views[step.pid].steps.append(step)
    assign_gpu(data, views)
    return [view for view in views.values() if view.threads or len(view.gpu_index)]


def _file_rank(data: TraceData) -> Optional[int]:
    info = data.members.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    return None


def _label(data: TraceData, pid: Pid, file_rank: Optional[int]) -> tuple[str, Optional[int]]:
    name = data.process_names.get(pid)
    if name is None:
        label = f"pid {pid}"
    elif str(pid) in name:
        label = name  # the sidecar's merged traces already say "vLLM worker rank 0 (pid 1234)"
    else:
        label = f"{name} (pid {pid})"
    match = _RANK_IN_LABEL.search(label)
    rank = int(match.group(1)) if match else file_rank
    if rank is not None and not match:
        label = f"rank {rank}: {label}"
    return label, rank


def track_view(data: TraceData, views: dict[Pid, ProcessView], track: int, device: int) -> Pid:
    """The pseudo-process of a GPU track with no known launches (a GPU-only trace)."""
    track_pid = data.tracks[track]
    key = ("gpu-track", track_pid)
    if key not in views:
        label = data.process_names.get(track_pid) or f"GPU {device}"
        rank = _RANK_IN_LABEL.search(label)
        views[key] = ProcessView(
            data=data, pid=f"track {track_pid}", label=f"{label} (no host events)", rank=int(rank.group(1)) if rank else None, threads={}
        )
    return key
