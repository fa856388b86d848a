"""How much memory a piece of the project's code keeps per step, as tracemalloc sees it. Not a test module.

What the code allocated and still holds, by the line that allocated each block, not a count of the
whole process's objects: servers starting on threads of the test process beside such a test once
freed 17-19 objects between two counts."""

from __future__ import annotations

import tracemalloc
from typing import Callable


def blocks_held(run_steps: Callable[[int, int], None], code: str) -> tuple[int, int]:
    """Blocks allocated by files matching ``code`` (a tracemalloc filename pattern) and still held after
    ``run_steps(0, 1_000)``, then after ``run_steps(1_000, 10_000)``: a per-step leak makes the second larger."""
    def held_after(first: int, count: int) -> int:
        run_steps(first, count)
        held = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, code)])
        return sum(stat.count for stat in held.statistics("lineno"))

    tracemalloc.start()
    try:
        return held_after(0, 1_000), held_after(1_000, 10_000)
    finally:
        tracemalloc.stop()
