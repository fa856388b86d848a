"""Split one trace file into processes and tie each GPU activity to the host call that issued it.

In a Kineto trace GPU events sit under a pid equal to the device index, not under the process that
launched them; the link is the ``correlation`` id shared by the kernel and its runtime call
(cudaLaunchKernel, cudaMemcpyAsync, cudaGraphLaunch, ...). Joining on it gives each activity its
process, launching thread and launch time. Correlation ids are unique within one process; when a
merged trace repeats one across processes, the launch that came last before the kernel wins.
Activities with no matching launch go to the process that issued most of the work on that device.
The join itself is a sorted search over numpy columns (ownership.py); the view is view.py.
"""

from __future__ import annotations

import re

from collections import defaultdict
from typing import Optional

from .collect import HostThread, Pid, TraceData
from .ownership import assign_gpu
from .view import RANK_IN_LABEL, ProcessView

__all__ = ["ProcessView", "split_processes"]


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
    assign_gpu(data, views)
    return [view for view in views.values() if view.threads or len(view.gpu_index)]


def _file_rank(data: TraceData) -> Optional[int]:
    info = data.members.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    return None


PID_IN_LABEL = re.compile(r"\(pid [0-9]+\)$")


def _label(data: TraceData, pid: Pid, file_rank: Optional[int]) -> tuple[str, Optional[int]]:
    name = data.process_names.get(pid)
    if name is None:
        label = f"pid {pid}"
    elif str(pid) in name or PID_IN_LABEL.search(name):
        # The sidecar's merged traces already say "worker rank 0 (pid 1234)" (under a track pid of
        # its own where two hosts' processes share a pid).
        label = name
    else:
        label = f"{name} (pid {pid})"
    match = RANK_IN_LABEL.search(label)
    rank = int(match.group(1)) if match else file_rank
    if rank is not None and not match:
        label = f"rank {rank}: {label}"
    return label, rank
