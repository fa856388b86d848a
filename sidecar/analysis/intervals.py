"""Unions, intersections and gaps of time intervals, vectorised with numpy.

A ``Spans`` here is always the output of ``union``: sorted, non-overlapping (start, end) columns.
Totals are summed left to right (``cumsum``), as a Python loop would, not pairwise (``np.sum``):
the figures must not change in the last bit when the implementation does.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np


class Spans(NamedTuple):
    start: np.ndarray
    end: np.ndarray

    def __len__(self) -> int:
        return len(self.start)


EMPTY = Spans(np.zeros(0), np.zeros(0))


def seq_sum(values: np.ndarray) -> float:
    """Left-to-right float sum, bit-for-bit what ``sum()`` over the values gives."""
    return float(np.cumsum(values)[-1]) if len(values) else 0.0


def union(start: np.ndarray, end: np.ndarray) -> Spans:
    """Merge overlapping or touching intervals. Input in any order."""
    if not len(start):
        return EMPTY
    order = np.lexsort((end, start))  # as sorted() orders (start, end) pairs
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]  # touching (start == reach) merges
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return Spans(s[first], reach[last])


def concat(parts: list[Spans]) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return EMPTY
    return np.concatenate([p.start for p in parts]), np.concatenate([p.end for p in parts])


def total(spans: Spans) -> float:
    return seq_sum(spans.end - spans.start)


def intersect(a: Spans, b: Spans) -> Spans:
    """Intersection of two unions: for each interval of ``a``, the intervals of ``b`` that overlap
    it (a range, found by bisection), in the order a two-pointer walk emits them."""
    if not len(a) or not len(b):
        return EMPTY
    lo = np.searchsorted(b.end, a.start, side="right")  # first b ending after a starts
    hi = np.searchsorted(b.start, a.end, side="left")  # first b starting at or after a ends
    count = np.maximum(hi - lo, 0)
    ia = np.repeat(np.arange(len(a)), count)
    offsets = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    jb = np.repeat(lo, count) + offsets
    start = np.maximum(a.start[ia], b.start[jb])
    end = np.minimum(a.end[ia], b.end[jb])
    keep = start < end
    return Spans(start[keep], end[keep])


def covered(spans: Spans, lo: float, hi: float) -> float:
    """How much of [lo, hi] a union covers. Bisects to the first candidate, so many queries on
    a long union stay cheap."""
    k = max(0, int(np.searchsorted(spans.start, lo, side="right")) - 1)
    done = 0.0
    n = len(spans)
    while k < n and spans.start[k] < hi:
        start, end = float(spans.start[k]), float(spans.end[k])
        if end > lo:
            done += min(end, hi) - max(start, lo)
        k += 1
    return done


def gaps(spans: Spans) -> Spans:
    """The holes between consecutive intervals of a union (not before the first or after the last)."""
    return Spans(spans.end[:-1], spans.start[1:])


def idle_around(spans: Spans, t: float) -> Optional[tuple[float, float]]:
    """The hole of the union that contains time ``t``, as (hole start, hole end); None when ``t``
    falls inside an interval or after the last one."""
    k = int(np.searchsorted(spans.start, t, side="right")) - 1
    if k >= 0 and spans.end[k] > t:
        return None  # busy at t
    if k + 1 >= len(spans):
        return None  # nothing runs after t: not a hole between activities
    return (float(spans.end[k]) if k >= 0 else t, float(spans.start[k + 1]))
