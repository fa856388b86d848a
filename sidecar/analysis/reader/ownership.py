"""Which process launched each GPU activity: the correlation join, on numpy columns.

Every runtime call that carries a correlation id some activity also carries goes into one table,
sorted by id; each activity finds its launch by bisection. An id held by exactly one launch (the
normal case) settles the activity at once. An id repeated across processes (merged traces of
workers that launch in lockstep) is settled one activity at a time: the launch from the process
that owns the GPU track (by its ``process_name``, else by most unambiguous activities), else the
last one issued before the activity started. Activities with no launch go to the track's owner,
or to a pseudo-process for the track when nobody owns it (GPU-only traces).
"""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from .arrays import distinct, isin
from .collect import Pid, TraceData
from .events import Kind
from .view import ProcessView, track_view

_PID_IN_LABEL = re.compile(r"\bpid\s*(\d+)")


def assign_gpu(data: TraceData, views: dict[Pid, ProcessView]) -> None:
    gpu = data.gpu
    if gpu is None or not len(gpu):
        return
    host_views = list(views)
    view_no = {pid: n for n, pid in enumerate(host_views)}
    keys = list(data.threads)
    thread_view = np.array([view_no[pid] for pid, _tid in keys], dtype=np.int64)
    # Runtime calls whose correlation id some activity carries, threads in order, then by index.
    wanted = distinct(gpu.corr[gpu.corr != -1])
    r_corr, r_thread, r_index, r_ts = [], [], [], []
    for t, thread in enumerate(data.threads.values()):
        pick = np.flatnonzero((thread.kind == Kind.RUNTIME) & isin(thread.corr, wanted))
        r_corr.append(thread.corr[pick])
        r_thread.append(np.full(len(pick), t, dtype=np.int64))
        r_index.append(pick)
        r_ts.append(thread.ts[pick])
    corr_all = np.concatenate(r_corr) if r_corr else np.zeros(0, dtype=np.int64)
    by_corr = np.argsort(corr_all, kind="stable")
    ids, first, counts = np.unique(corr_all[by_corr], return_index=True, return_counts=True)
    launch_thread = np.concatenate(r_thread)[by_corr] if r_corr else np.zeros(0, dtype=np.int64)
    launch_index = np.concatenate(r_index)[by_corr] if r_corr else np.zeros(0, dtype=np.int64)
    launch_ts = np.concatenate(r_ts)[by_corr] if r_corr else np.zeros(0)

    n = len(gpu)
    pos = np.minimum(np.searchsorted(ids, gpu.corr), max(len(ids) - 1, 0))
    matched = (gpu.corr != -1) & (len(ids) > 0) & (ids[pos] == gpu.corr if len(ids) else False)
    single = matched & (counts[pos] == 1 if len(ids) else False)
    entry = np.where(single, first[pos] if len(ids) else 0, -1)
    owner = np.full(n, -1, dtype=np.int64)
    thread_of = np.full(n, -1, dtype=np.int64)
    index_of = np.full(n, -1, dtype=np.int64)
    issued = gpu.ts.copy()
    hit = np.flatnonzero(single)
    thread_of[hit] = launch_thread[entry[hit]]
    index_of[hit] = launch_index[entry[hit]]
    issued[hit] = launch_ts[entry[hit]]
    owner[hit] = thread_view[thread_of[hit]]

    track_owner = _owners_by_votes(gpu.track[hit], owner[hit], len(host_views))
    track_owner.update(_owners_by_label(data, view_no))
    for i in np.flatnonzero(matched & ~single).tolist():  # ids repeated across processes
        k = int(first[pos[i]])
        candidates = range(k, k + int(counts[pos[i]]))
        j = _pick(candidates, thread_view, launch_thread, launch_ts, track_owner.get(int(gpu.track[i])), float(gpu.ts[i]))
        thread_of[i], index_of[i], issued[i] = launch_thread[j], launch_index[j], launch_ts[j]
        owner[i] = thread_view[launch_thread[j]]
    single_host = 0 if len(host_views) == 1 else None
    unowned = np.flatnonzero(~matched)
    for track in dict.fromkeys(gpu.track[unowned].tolist()):  # tracks in order of first need
        pick = unowned[gpu.track[unowned] == track]
        vno = track_owner.get(track, single_host)
        if vno is None:
            key = track_view(data, views, track, int(gpu.device[pick[0]]))
            vno = list(views).index(key)
        owner[pick] = vno

    local = _local_thread_numbers(keys)
    for vno, view in enumerate(views.values()):
        sel = np.flatnonzero(owner == vno)
        view.gpu_index = sel
        t = thread_of[sel]
        view.launch_thread = np.where(t >= 0, local[np.maximum(t, 0)] if len(local) else -1, -1)
        view.launch_index = index_of[sel]
        view.launch_ts = issued[sel]


def _local_thread_numbers(keys: list[tuple]) -> np.ndarray:
    """Global thread number -> its position among its own process's threads."""
    seen: dict[Pid, int] = {}
    out = []
    for pid, _tid in keys:
        out.append(seen.get(pid, 0))
        seen[pid] = out[-1] + 1
    return np.array(out, dtype=np.int64)


def _owners_by_votes(tracks: np.ndarray, owners: np.ndarray, n_views: int) -> dict[int, int]:
    """Per GPU track, the process owning most of its unambiguous activities; ties go to the
    process seen first on the track (as Counter.most_common orders them)."""
    if not len(tracks):
        return {}
    pair = tracks.astype(np.int64) * max(n_views, 1) + owners
    uniq, first, counts = np.unique(pair, return_index=True, return_counts=True)
    best: dict[int, tuple[int, int, int]] = {}
    for p, f, c in zip(uniq.tolist(), first.tolist(), counts.tolist()):
        track, vno = divmod(p, max(n_views, 1))
        cur = best.get(track)
        if cur is None or c > cur[0] or (c == cur[0] and f < cur[1]):
            best[track] = (c, f, vno)
    return {track: vno for track, (_c, _f, vno) in best.items()}


def _owners_by_label(data: TraceData, view_no: dict[Pid, int]) -> dict[int, int]:
    """GPU tracks whose process_name names their host process, as the sidecar's merged traces do
    ("worker rank 1 (pid 4321) device 0"). This settles ownership even when every correlation id
    is repeated across processes (tensor-parallel workers run the same launches in lockstep)."""
    owners: dict[int, int] = {}
    for track, track_pid in enumerate(data.tracks):
        match = _PID_IN_LABEL.search(data.process_names.get(track_pid, ""))
        if match and track_pid not in view_no:
            pid = int(match.group(1))
            if pid in view_no:
                owners[track] = view_no[pid]
    return owners


def _pick(candidates: range, thread_view, launch_thread, launch_ts, track_owner: Optional[int], ts: float) -> int:
    """Among launches sharing a correlation id: the one from the process owning the GPU track;
    failing that, the last one issued before the activity started (the first such on ties)."""
    chosen = list(candidates)
    if track_owner is not None:
        mine = [j for j in chosen if thread_view[launch_thread[j]] == track_owner]
        if mine:
            chosen = mine
    best = None
    for j in chosen:
        start = launch_ts[j]
        if start <= ts and (best is None or start > best[0]):
            best = (start, j)
    return best[1] if best else chosen[0]
