"""Split one trace file into processes and tie each GPU activity to the host call that issued it.

In a Kineto trace GPU events sit under a pid equal to the device index, not under the process that
launched them; the link is the ``correlation`` id shared by the kernel and its runtime call
(cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch, ...). Joining on it gives each activity its
process, launching thread and launch time. Correlation ids are unique within one process; when a
merged trace repeats one across processes, the launch that came last before the kernel wins.
Activities with no matching launch go to the process that issued most of the work on that device.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from itertools import compress
from typing import Optional

from .collect import GpuActivities, HostThread, Pid, StepMark, TraceData
from .events import STEP_PREFIX, Kind
from .nesting import ThreadTree, build_tree

_RANK_IN_LABEL = re.compile(r"\brank\s*(\d+)", re.IGNORECASE)
_PID_IN_LABEL = re.compile(r"\bpid\s*(\d+)")


@dataclass
class ProcessView:
    """One process (or rank) of a trace file, with the GPU work it launched."""

    data: TraceData
    pid: Pid
    label: str
    rank: Optional[int]
    threads: dict[Pid, HostThread]
    gpu_index: array = field(default_factory=lambda: array("q"))  # indices into data.gpu
    launch_tid: list = field(default_factory=list)  # per activity: launching tid, or None
    launch_index: array = field(default_factory=lambda: array("q"))  # index in that thread, or -1
    launch_ts: array = field(default_factory=lambda: array("d"))  # host time of the launch (own start if unknown)
    steps: list[StepMark] = field(default_factory=list)
    _trees: dict[Pid, ThreadTree] = field(default_factory=dict)
    _step_starts: Optional[list[float]] = None
    _runtime: dict[Pid, array] = field(default_factory=dict)

    @property
    def gpu(self) -> GpuActivities:
        return self.data.gpu

    def runtime_calls(self, tid: Pid) -> array:
        """Indices of the runtime/driver calls of thread ``tid``, in time order (cached)."""
        found = self._runtime.get(tid)
        if found is None:
            thread = self.threads[tid]
            calls = list(compress(range(len(thread.kind)), map(int(Kind.RUNTIME).__eq__, thread.kind)))
            calls.sort(key=thread.ts.__getitem__)
            found = self._runtime[tid] = array("q", calls)  # 8 bytes an entry instead of 36
        return found

    def tree(self, tid: Pid) -> ThreadTree:
        tree = self._trees.get(tid)
        if tree is None:
            tree = self._trees[tid] = build_tree(self.threads[tid])
        return tree

    def name(self, name_id: int) -> str:
        return self.data.names[name_id]

    def step_index_at(self, t: float) -> int:
        """Index in ``steps`` of the ProfilerStep running at host time ``t``; -1 if none."""
        if self._step_starts is None:
            self._step_starts = [s.ts for s in self.steps]
        k = bisect_right(self._step_starts, t) - 1
        if k >= 0 and t <= self.steps[k].ts + self.steps[k].dur:
            return k
        return -1

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
        for p in self.tree(tid).ancestors(index):  # innermost first
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
                starts.append(min(thread.ts))
                ends.append(max(map(float.__add__, thread.ts, thread.dur)))
        gpu = self.gpu
        for i in self.gpu_index:
            starts.append(gpu.ts[i])
            ends.append(gpu.ts[i] + gpu.dur[i])
        if not starts:
            return (0.0, 0.0)
        return (min(starts), max(ends))


def split_processes(data: TraceData, file_label: Optional[str] = None) -> list[ProcessView]:
    """The processes of one trace file, host processes first, in pid order of appearance."""
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
    _assign_gpu(data, views)
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


def _assign_gpu(data: TraceData, views: dict[Pid, ProcessView]) -> None:
    gpu = data.gpu
    if not len(gpu):
        return
    launches = _launches_by_correlation(data)
    # First the activities whose correlation id names one launch: they tell which host process
    # owns each GPU track (a device pid; unique per process in the sidecar's merged traces).
    owner: list[Optional[tuple]] = []
    track_votes: dict[int, Counter] = defaultdict(Counter)
    for i, corr in enumerate(gpu.corr):
        found = launches.get(corr) if corr != -1 else None
        owner.append(found)  # type: ignore[arg-type]
        if found is not None and not isinstance(found, list):
            track_votes[gpu.track[i]][found[0]] += 1
    track_owner = {track: votes.most_common(1)[0][0] for track, votes in track_votes.items()}
    track_owner.update(_owners_by_label(data, views))
    single_host = next(iter(views)) if len(views) == 1 else None
    for i, found in enumerate(owner):
        if isinstance(found, list):  # a correlation id repeated across processes
            found = _pick(data, found, track_owner.get(gpu.track[i]), gpu.ts[i])
        if found is not None:
            pid, tid, index = found
            issued = data.threads[(pid, tid)].ts[index]
        else:
            issued = gpu.ts[i]
            tid, index = None, -1
            pid = track_owner.get(gpu.track[i], single_host)
            if pid is None:  # GPU-only trace, or a track with no known launches
                track_pid = data.tracks[gpu.track[i]]
                pid = ("gpu-track", track_pid)
                if pid not in views:
                    label = data.process_names.get(track_pid) or f"GPU {gpu.device[i]}"
                    rank = _RANK_IN_LABEL.search(label)
                    views[pid] = ProcessView(
                        data=data, pid=f"track {track_pid}", label=f"{label} (no host events)", rank=int(rank.group(1)) if rank else None, threads={}
                    )
        view = views[pid]
        view.gpu_index.append(i)
        view.launch_tid.append(tid)
        view.launch_index.append(index)
        view.launch_ts.append(issued)


def _owners_by_label(data: TraceData, views: dict[Pid, ProcessView]) -> dict[int, Pid]:
    """GPU tracks whose process_name names their host process, as the sidecar's merged traces do
    ("worker rank 1 (pid 4321) device 0"). This settles ownership even when every correlation id
    is repeated across processes (tensor-parallel workers run the same launches in lockstep)."""
    owners: dict[int, Pid] = {}
    for track, track_pid in enumerate(data.tracks):
        match = _PID_IN_LABEL.search(data.process_names.get(track_pid, ""))
        if match and track_pid not in views:
            pid = int(match.group(1))
            if pid in views:
                owners[track] = pid
    return owners


def _launches_by_correlation(data: TraceData) -> dict[int, object]:
    """correlation → (pid, tid, index) of the runtime call, or a list of them when a merged
    trace repeats an id. Only ids some GPU activity carries are kept."""
    wanted = set(data.gpu.corr)
    wanted.discard(-1)
    launches: dict[int, object] = {}
    for (pid, tid), thread in data.threads.items():
        kinds = thread.kind
        corrs = thread.corr
        # compress/map keep the scan over every host event in C; only matches reach Python.
        for i in compress(range(len(corrs)), map(wanted.__contains__, corrs)):
            if kinds[i] != Kind.RUNTIME:
                continue
            corr = corrs[i]
            entry = (pid, tid, i)
            previous = launches.get(corr)
            if previous is None:
                launches[corr] = entry
            elif isinstance(previous, list):
                previous.append(entry)
            else:
                launches[corr] = [previous, entry]
    return launches


def _pick(data: TraceData, candidates: list, track_owner: Optional[Pid], ts: float) -> tuple:
    """Among launches sharing a correlation id: the one from the process owning the GPU track;
    failing that, the last one issued before the activity started."""
    if track_owner is not None:
        mine = [c for c in candidates if c[0] == track_owner]
        if mine:
            candidates = mine
    return _latest_before(data, candidates, ts)


def _latest_before(data: TraceData, candidates: list, ts: float) -> tuple:
    best = None
    for pid, tid, index in candidates:
        start = data.threads[(pid, tid)].ts[index]
        if start <= ts and (best is None or start > best[0]):
            best = (start, (pid, tid, index))
    return best[1] if best else candidates[0]
