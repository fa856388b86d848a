"""Unions, intersections and gaps of time intervals.

An interval list here is always the output of ``union``: sorted, non-overlapping ``(start, end)``
pairs, so every other function can walk it once.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterable, Sequence

Interval = tuple[float, float]


def union(pairs: Iterable[Interval]) -> list[Interval]:
    """Merge overlapping or touching intervals. Input in any order."""
    merged: list[Interval] = []
    cur_start = cur_end = None
    for start, end in sorted(pairs):
        if cur_end is None:
            cur_start, cur_end = start, end
        elif start <= cur_end:
            if end > cur_end:
                cur_end = end
        else:
            merged.append((cur_start, cur_end))  # type: ignore[arg-type]
            cur_start, cur_end = start, end
    if cur_end is not None:
        merged.append((cur_start, cur_end))  # type: ignore[arg-type]
    return merged


def total(intervals: Iterable[Interval]) -> float:
    return sum(end - start for start, end in intervals)


def intersect(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """Intersection of two unions (two-pointer walk)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        start = max(a[i][0], b[j][0])
        end = min(a[i][1], b[j][1])
        if start < end:
            out.append((start, end))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def covered(intervals: Sequence[Interval], starts: Sequence[float], lo: float, hi: float) -> float:
    """How much of [lo, hi] a union covers; ``starts`` is ``[s for s, _ in intervals]``. Bisects
    to the first candidate, so many queries on a long union stay cheap."""
    k = max(0, bisect_right(starts, lo) - 1)
    done = 0.0
    while k < len(intervals) and intervals[k][0] < hi:
        start, end = intervals[k]
        if end > lo:
            done += min(end, hi) - max(start, lo)
        k += 1
    return done


def gaps(intervals: Sequence[Interval]) -> list[Interval]:
    """The holes between consecutive intervals of a union (not before the first or after the last)."""
    return [(intervals[k][1], intervals[k + 1][0]) for k in range(len(intervals) - 1)]


def idle_around(intervals: Sequence[Interval], starts: Sequence[float], t: float) -> tuple[float, float] | None:
    """The hole of the union that contains time ``t``, as (hole start, hole end); None when ``t``
    falls inside an interval or after the last one. ``starts`` is ``[s for s, _ in intervals]``."""
    k = bisect_right(starts, t) - 1
    if k >= 0 and intervals[k][1] > t:
        return None  # busy at t
    if k + 1 >= len(intervals):
        return None  # nothing runs after t: not a hole between activities
    return (intervals[k][1] if k >= 0 else t, intervals[k + 1][0])
