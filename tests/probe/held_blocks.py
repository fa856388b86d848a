"""How much memory a piece of the project's code keeps per step, as tracemalloc sees it. Not a test module.

What the code allocated and still holds, by the line that allocated each block, not a count of the
whole process's objects: servers starting on threads of the test process beside such a test once
freed 17-19 objects between two counts."""

from __future__ import annotations

import tracemalloc
from typing import Callable


# Deep enough to reach from an allocation in the step path back to ``held_after`` below.
FRAMES = 32


def blocks_held(run_steps: Callable[[int, int], None], code: str) -> tuple[int, int]:
    """Blocks allocated by files matching ``code`` (a tracemalloc filename pattern) within
    ``run_steps`` and still held after ``run_steps(0, 1_000)``, then after ``run_steps(1_000, 10_000)``:
    a per-step leak makes the second larger. Only blocks whose allocation came through ``run_steps``
    count: another thread of the test process (a span exporter an earlier test left running, waking
    on its timer) allocates in the same files meanwhile, which once made 2 blocks 6."""
    def held_after(first: int, count: int) -> int:
        run_steps(first, count)
        snapshot = tracemalloc.take_snapshot()
        through_steps = snapshot.filter_traces([tracemalloc.Filter(True, __file__, all_frames=True)])
        held = through_steps.filter_traces([tracemalloc.Filter(True, code)])
        return sum(stat.count for stat in held.statistics("lineno"))

    tracemalloc.start(FRAMES)
    try:
        return held_after(0, 1_000), held_after(1_000, 10_000)
    finally:
        tracemalloc.stop()
