"""Unions, intersections and gaps of time intervals, vectorised with numpy.

A ``Spans`` here is always the output of ``union``: sorted, non-overlapping (start, end) columns.
Totals are summed left to right (``cumsum``), as a Python loop would, not pairwise (``np.sum``):
the figures must not change in the last bit when the implementation does.
"""

from __future__ import annotations

from typing import NamedTuple

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


def covered(spans: Spans, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """How much of each [lo, hi] a union covers, for many windows at once: the union's covered
    length up to hi minus that up to lo, from one prefix sum of its interval lengths."""
    return _covered_until(spans, hi) - _covered_until(spans, lo)


def _covered_until(spans: Spans, t: np.ndarray) -> np.ndarray:
    """Covered length of (-inf, t] for each t."""
    lengths = spans.end - spans.start
    before = np.concatenate(([0.0], np.cumsum(lengths)))  # before[k]: length of intervals 0..k-1
    k = np.searchsorted(spans.start, t, side="right")  # intervals starting at or before t
    last = np.maximum(k - 1, 0)
    partial = np.clip(t - spans.start[last], 0.0, lengths[last]) if len(spans) else np.zeros(len(t))
    return np.where(k > 0, before[last] + partial, 0.0)


def gaps(spans: Spans) -> Spans:
    """The holes between consecutive intervals of a union (not before the first or after the last)."""
    return Spans(spans.end[:-1], spans.start[1:])

