"""Idle gaps on the GPU and what caused each.

A gap is a hole between two consecutive busy intervals (kernel union) of one device, at least
``min_gap_us`` long; shorter holes are ordinary launch spacing. Its cause, tried in this order:

* ``sync``: a synchronising call (see syncs.py) had already started when the GPU went idle, so the
  host was blocked and queued nothing new;
* ``memcpy``: copies ran for at least half of the gap (the GPU waited on a transfer);
* ``launch``: the call that launched the next kernel began before the gap did: the work was being
  submitted and the gap is launch latency (a CPU-bound launch path, many tiny kernels);
* ``host``: that call began only after the GPU went idle: the host was busy elsewhere (Python,
  scheduling, tokenisation, ...); ``detail`` names the op that finally launched the work;
* ``unknown``: the next kernel has no matching launch in the trace.
"""

from __future__ import annotations

import msgspec
from typing import Sequence

import numpy as np

from . import intervals
from ..reader.events import Kind
from .kernels import GpuStats, gpu_stats, us
from ..reader.view import ProcessView
from .syncs import SyncFinding, find_syncs

MIN_GAP_US = 10.0
CAUSES = ("sync", "memcpy", "launch", "host", "unknown")
_SYNC, _MEMCPY, _LAUNCH, _HOST, _UNKNOWN = range(5)
_LOOKBACK_US = 10_000_000  # 10 s: no call blocks longer; a sync that began earlier is not the cause
_I64 = np.zeros(0, dtype=np.int64)


class GapTable(msgspec.Struct):
    """The gaps of one process, one row each, devices in order and each device's gaps in time
    order: columns rather than one object per gap (the largest trace has 10k gaps)."""

    device: np.ndarray = msgspec.field(default_factory=lambda: _I64)
    start: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0))
    end: np.ndarray = msgspec.field(default_factory=lambda: np.zeros(0))
    cause: np.ndarray = msgspec.field(default_factory=lambda: _I64)  # index into CAUSES
    next_activity: np.ndarray = msgspec.field(default_factory=lambda: _I64)  # the kernel that ended the gap
    prev_activity: np.ndarray = msgspec.field(default_factory=lambda: _I64)  # the kernel that ended last before it
    step_index: np.ndarray = msgspec.field(default_factory=lambda: _I64)  # step of the next kernel's launch, -1 none
    sync: np.ndarray = msgspec.field(default_factory=lambda: _I64)  # index into the sync list, -1 none
    detail: dict[int, str] = msgspec.field(default_factory=dict)  # filled for the largest gaps only

    @property
    def dur(self) -> np.ndarray:
        return self.end - self.start

    def __len__(self) -> int:
        return len(self.start)


def find_gaps(view: ProcessView, stats: GpuStats, syncs: Sequence[SyncFinding], min_gap_us: float = MIN_GAP_US, describe_top: int = 10) -> GapTable:
    """All gaps of at least ``min_gap_us`` on the devices of one process, with their cause; the
    ``describe_top`` largest also get ``detail`` (naming ops costs a walk up the call tree)."""
    ts, dur, kind, device = view.columns("ts", "dur", "kind", "device")
    end = ts + dur
    sync_list = sorted(syncs, key=lambda f: f.ts)
    parts = []
    for dev, busy in stats.device_busy.items():
        holes = intervals.gaps(busy)
        wide = holes.end - holes.start >= min_gap_us
        g_start, g_end = holes.start[wide], holes.end[wide]
        mine = device == dev
        kern = np.flatnonzero(mine & (kind == Kind.KERNEL))  # k: position among the process's activities
        by_start = kern[np.lexsort((kern, end[kern], ts[kern]))]  # as sorted((start, end, k))
        by_end = kern[np.lexsort((kern, end[kern]))]  # as sorted((end, k))
        nxt = by_start[np.searchsorted(ts[by_start], g_end, side="left")]
        prv = by_end[np.minimum(len(by_end) - 1, np.searchsorted(end[by_end], g_start, side="left"))]
        copy = np.flatnonzero(mine & (kind != Kind.KERNEL))
        copies = intervals.union(ts[copy], end[copy])
        sync = _blocking_syncs(sync_list, g_start)
        cause = np.where(view.launch_thread[nxt] < 0, _UNKNOWN, np.where(view.launch_ts[nxt] <= g_start, _LAUNCH, _HOST))
        if len(copies):
            cause[_mostly_copies(copies, g_start, g_end)] = _MEMCPY
        cause[sync >= 0] = _SYNC
        parts.append((np.full(len(g_start), dev, dtype=np.int64), g_start, g_end, cause, nxt, prv, sync))
    if not parts:
        return GapTable()
    columns = [np.concatenate([p[c] for p in parts]) for c in range(7)]
    table = GapTable(columns[0], columns[1], columns[2], columns[3], columns[4], columns[5], view.step_indices(view.launch_ts[columns[4]]), columns[6])
    for row in np.argsort(-table.dur, kind="stable")[:describe_top].tolist():
        table.detail[row] = describe(view, table, row, sync_list)
    return table


def attribute_idle(syncs: Sequence[SyncFinding], table: GapTable) -> list[SyncFinding]:
    """``syncs`` with ``gpu_idle_after`` set to the gaps attributed to each (cause ``sync``): the one
    attribution the sync list and the gap causes share. A sync called while the GPU was already
    idle caused none of that idle time, however long it lasted."""
    ordered = sorted(syncs, key=lambda f: f.ts)  # the order find_gaps indexes them in
    if not len(table):
        return [msgspec.structs.replace(f, gpu_idle_after=0.0) for f in ordered]
    mine = table.sync >= 0
    idle = np.bincount(table.sync[mine], weights=table.dur[mine], minlength=len(ordered))
    return [msgspec.structs.replace(f, gpu_idle_after=float(idle[i])) for i, f in enumerate(ordered)]


def _mostly_copies(copies: intervals.Spans, g_start: np.ndarray, g_end: np.ndarray) -> np.ndarray:
    """Gaps during which copies ran for at least half the time."""
    return intervals.covered(copies, g_start, g_end) >= 0.5 * (g_end - g_start)


def _blocking_syncs(sync_list: Sequence[SyncFinding], g_start: np.ndarray, chunk: int = 2048) -> np.ndarray:
    """Per gap: the index of a sync that began before the GPU went idle and was still blocking
    when it did, -1 for none. Looking back from the last sync begun by then, the first one still
    blocking wins, and the look-back stops at a sync begun over 10 s before the gap."""
    found = np.full(len(g_start), -1, dtype=np.int64)
    if not sync_list or not len(g_start):
        return found
    s_ts = np.array([f.ts for f in sync_list])
    s_end = np.array([f.ts + f.dur for f in sync_list])
    last = np.searchsorted(s_ts, g_start, side="right") - 1
    idx = np.arange(len(sync_list))
    for lo in range(0, len(g_start), chunk):
        g, k0 = g_start[lo : lo + chunk, None], last[lo : lo + chunk, None]
        ok = (s_end[None, :] >= g) & (idx[None, :] <= k0)
        any_ok = ok.any(axis=1)
        k = len(sync_list) - 1 - np.argmax(ok[:, ::-1], axis=1)
        nxt = np.minimum(k + 1, len(sync_list) - 1)
        reached = (k == k0[:, 0]) | (g[:, 0] - s_ts[nxt] <= _LOOKBACK_US)
        found[lo : lo + chunk] = np.where(any_ok & reached, k, -1)
    return found


def describe(view: ProcessView, table: GapTable, row: int, sync_list: Sequence[SyncFinding]) -> str:
    """What to look at: the sync and its call site, or the call that launched the next kernel
    and the op (or Python frame) it was made from."""
    sync = int(table.sync[row])
    if sync >= 0:
        f = sync_list[sync]
        return f"{f.name} in {f.python or f.site or 'no recorded op'}"
    nxt = int(table.next_activity[row])
    tid = view.launch_tid(nxt)
    if tid is None or CAUSES[table.cause[row]] == "memcpy":
        return ""
    index = int(view.launch_index[nxt])
    site, python, _stack = view.enclosing(tid, index)
    where = python or site
    if CAUSES[table.cause[row]] == "launch":
        return f"{view.data.names[view.threads[tid].name[index]]} in {where or 'no recorded op'}"
    # The host was elsewhere until it launched the next kernel: name what launched it, the place to look.
    return f"host busy until {where} launched the next kernel" if where else "host busy until the next launch (outside any recorded op)"


class GapPart(msgspec.Struct):
    """What the summary needs of one process's gaps: durations and causes of all, and the
    largest few already rendered (so the process's event arrays can be freed)."""

    dur: np.ndarray
    cause: np.ndarray
    largest: list[tuple[float, dict]]  # (duration, JSON row), longest first


def part(view: ProcessView, table: GapTable, origin: float, top_n: int) -> GapPart:
    dur = table.dur
    names, gpu_name = view.data.names, view.gpu.name
    largest = []
    for row in np.argsort(-dur, kind="stable")[:top_n].tolist():
        step = int(table.step_index[row])
        largest.append(
            (
                float(dur[row]),
                {
                    "process": view.label,
                    "device": int(table.device[row]),
                    "at_us": us(table.start[row] - origin),
                    "dur_us": us(dur[row]),
                    "cause": CAUSES[table.cause[row]],
                    "detail": table.detail.get(row, ""),
                    "preceded_by": names[gpu_name[view.gpu_index[table.prev_activity[row]]]],
                    "followed_by": names[gpu_name[view.gpu_index[table.next_activity[row]]]],
                    "step": view.steps[step].number if step >= 0 else None,
                },
            )
        )
    return GapPart(dur, table.cause, largest)


def summarize(parts: Sequence[GapPart], top_n: int, min_gap_us: float = MIN_GAP_US) -> dict:
    """The ``gaps`` object over processes (in order). Sums run in gap order, as before."""
    dur = np.concatenate([p.dur for p in parts]) if parts else np.zeros(0)
    cause = np.concatenate([p.cause for p in parts]) if parts else _I64
    counts = np.bincount(cause, minlength=len(CAUSES))
    totals = np.bincount(cause, weights=dur, minlength=len(CAUSES))
    by_cause = {c: {"count": int(counts[n]), "total_us": us(totals[n])} for n, c in enumerate(CAUSES)}
    # Each process's own top_n holds every row of the overall top_n; sorted() is stable, so ties
    # keep process order, then gap order, as one sort over all gaps would.
    candidates = [c for p in parts for c in p.largest]
    return {
        "min_gap_us": min_gap_us,
        "count": len(dur),
        "total_us": us(intervals.seq_sum(dur)) if len(dur) else 0,
        "by_cause": by_cause,
        "largest": [row for _d, row in sorted(candidates, key=lambda c: -c[0])[:top_n]],
    }


def find_process_syncs(view: ProcessView) -> list[SyncFinding]:
    """The syncs of a process with the idle time they caused, without the rest of the analysis: what
    the hidden-sync detector needs to read a trace (``sidecar.analysis.sync_sites``)."""
    gpu = gpu_stats(view, view.window())
    found = find_syncs(view)
    return attribute_idle(found, find_gaps(view, gpu, found, describe_top=0))
