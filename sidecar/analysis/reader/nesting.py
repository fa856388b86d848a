"""Which host event encloses which, per thread, by time nesting.

Events of one thread nest like a call stack: a child starts at or after its parent and ends before
it. The reference method sorts by (start, longest first) and walks with a stack, popping entries
that ended at or before the next start. Its answer has a closed form that numpy can compute for all
events at once: in that order, the parent of event i is the *latest earlier* event j whose end is
after i's start (every such j is still on the stack, since popping needs end <= a start <= i's
start, and the stack top is the latest one pushed). That "latest j < i with end_j > start_i" is
found for every i together by binary lifting over a sparse table of running maxima of the ends
(log2 n vectorised steps instead of n Python steps). This holds for any input, nested or not.

From the parent links come CPU self times (duration minus direct children, as ``key_averages``
counts "Self CPU") and, for any runtime call, the chain of ops / annotations / Python frames
around it. Child time is accumulated with ``bincount`` in the same order as the stack walk added
it, so every float sum is bit-for-bit the same.
"""

from __future__ import annotations

import msgspec

import numpy as np

from .collect import HostThread


class ThreadTree(msgspec.Struct):
    """Parent links and child time of one thread's events, indexed like the HostThread arrays."""

    parent: np.ndarray  # index of the innermost enclosing event, -1 for a top-level event
    child_time: np.ndarray  # time covered by direct children (clipped to the parent)

    def ancestors(self, i: int, limit: int = 64) -> list[int]:
        """Enclosing events of ``i``, innermost first."""
        chain = []
        p = int(self.parent[i])
        while p >= 0 and len(chain) < limit:
            chain.append(p)
            p = int(self.parent[p])
        return chain


def build_tree(thread: HostThread) -> ThreadTree:
    ts, dur = thread.ts, thread.dur
    n = len(ts)
    order = start_order(ts, dur)
    start = ts[order]
    end = start + dur[order]
    pos = _latest_earlier_ending_after(start, end)  # parent's position in `order`, -1 for none
    has = pos >= 0
    parent_sorted = np.where(has, order[np.maximum(pos, 0)], -1)
    parent = np.full(n, -1, dtype=np.int64)
    parent[order] = parent_sorted
    child_end = np.minimum(end[has], end[pos[has]])
    child_time = np.bincount(parent_sorted[has], weights=child_end - start[has], minlength=n) if n else np.zeros(0)
    return ThreadTree(parent=parent, child_time=child_time)


def start_order(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Indices by start, longest first among equal starts, file order among full ties: exactly
    ``np.lexsort((-dur, ts))``. A thread's events are nearly in start order already, where a
    stable argsort of ts alone is ~20x cheaper than lexsort; only the runs of equal starts (a
    parent and its first child) are then ordered by duration, with lexsort over those alone."""
    order = np.argsort(ts, kind="stable")
    if len(order) < 2:
        return order
    sorted_ts = ts[order]
    tied = sorted_ts[1:] == sorted_ts[:-1]
    if not tied.any():
        return order
    member = np.zeros(len(order), dtype=bool)
    member[:-1] |= tied
    member[1:] |= tied
    at = np.flatnonzero(member)
    group = order[at]  # equal starts stay together: ts is the first key again
    order[at] = group[np.lexsort((-dur[group], ts[group]))]
    return order


def _latest_earlier_ending_after(start: np.ndarray, end: np.ndarray, chunk: int = 1 << 13) -> np.ndarray:
    """For each i: the largest j < i with end[j] > start[i], or -1. Done a chunk at a time to keep
    the sparse table small (it holds log2(size) copies of the ends): for the events of one chunk,
    the only earlier candidates are those still open when the chunk starts (end > its first start,
    since starts only grow), usually a few enclosing ops, prepended to the chunk."""
    n = len(start)
    out = np.empty(n, dtype=np.int64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        live = np.flatnonzero(end[:lo] > start[lo]) if lo else np.zeros(0, dtype=np.int64)
        pick = np.concatenate([live, np.arange(lo, hi)])
        local = _in_block(start[pick], end[pick])[len(live) :]
        out[lo:hi] = np.where(local >= 0, pick[np.maximum(local, 0)], -1)
    return out


def _in_block(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """For each i: the largest j < i with end[j] > start[i], or -1. Binary lifting: ``cur`` moves
    left over blocks whose maximum end is <= start[i]; the table level k holds the maximum of
    end over [x, x + 2**k)."""
    n = len(start)
    cur = np.arange(n)
    if n < 2:
        return cur - 1
    levels = [end]
    while (2 << (len(levels) - 1)) <= n:
        prev, half = levels[-1], 1 << (len(levels) - 1)
        levels.append(np.maximum(prev[:-half], prev[half:]))
    for k in range(len(levels) - 1, -1, -1):
        width = 1 << k
        cand = cur - width
        ok = cand >= 0
        table = levels[k]
        safe = np.where(ok, cand, 0)
        safe = np.minimum(safe, len(table) - 1)
        move = ok & (table[safe] <= start)
        cur = np.where(move, cand, cur)
    return cur - 1
