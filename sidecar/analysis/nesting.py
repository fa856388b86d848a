"""Which host event encloses which, per thread, by time nesting.

Events of one thread nest like a call stack: a child starts at or after its parent and ends before
it. Sorting by (start, longest first) and walking with a stack gives every event its parent in one
pass. From that come CPU self times (duration minus direct children, as ``key_averages`` counts
"Self CPU") and, for any runtime call, the chain of ops / annotations / Python frames around it.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from .collect import HostThread


@dataclass
class ThreadTree:
    """Parent links and child time of one thread's events, indexed like the HostThread arrays."""

    parent: array  # index of the innermost enclosing event, -1 for a top-level event
    child_time: array  # time covered by direct children (clipped to the parent)

    def self_time(self, thread: HostThread, i: int) -> float:
        value = thread.dur[i] - self.child_time[i]
        return value if value > 0.0 else 0.0

    def ancestors(self, i: int, limit: int = 64) -> list[int]:
        """Enclosing events of ``i``, innermost first."""
        chain = []
        p = self.parent[i]
        while p >= 0 and len(chain) < limit:
            chain.append(p)
            p = self.parent[p]
        return chain


def build_tree(thread: HostThread) -> ThreadTree:
    ts, dur = thread.ts, thread.dur
    n = len(ts)
    order = sorted(range(n), key=lambda i: (ts[i], -dur[i]))
    parent = array("q", [-1]) * n
    child_time = array("d", [0.0]) * n
    stack_idx: list[int] = []
    stack_end: list[float] = []
    for i in order:
        start = ts[i]
        while stack_end and stack_end[-1] <= start:
            stack_end.pop()
            stack_idx.pop()
        end = start + dur[i]
        if stack_idx:
            p = stack_idx[-1]
            parent[i] = p
            p_end = stack_end[-1]
            child_time[p] += (end if end < p_end else p_end) - start
        stack_idx.append(i)
        stack_end.append(end)
    return ThreadTree(parent=parent, child_time=child_time)
