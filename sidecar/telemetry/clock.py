"""Turning an engine's monotonic timestamps into the wall-clock times spans need.

vLLM mixes two clocks in one request's stats. ``arrival_time`` and ``IterationStats.iteration_timestamp``
are wall clock (``time.time()`` in the API server). ``queued_ts``, ``scheduled_ts``, ``first_token_ts``
and ``last_token_ts`` are ``time.monotonic()`` read in the engine-core process. On Linux
``time.monotonic()`` is CLOCK_MONOTONIC, one clock for the whole host (seconds since boot, not per
process), so a reading from the engine core converts to wall time with the offset
``time.time() - time.monotonic()`` measured in the API server. The offset is measured when it is used,
so NTP steps of the wall clock are followed. When the engine core runs on another host (its clock then
has another origin) the converted times land outside the request's wall-clock bounds; ``anchored``
then pins the last token to the moment the API server saw it, which keeps every duration exact and is
off only by the output's transfer time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ClockOffset:
    """``wall = monotonic + wall_minus_monotonic`` (seconds)."""

    wall_minus_monotonic: float

    @classmethod
    def measure(cls) -> "ClockOffset":
        # Read the two clocks three times and keep the pair read closest together.
        best = None
        for _ in range(3):
            m0 = time.monotonic()
            w = time.time()
            m1 = time.monotonic()
            if best is None or m1 - m0 < best[0]:
                best = (m1 - m0, w - (m0 + m1) / 2)
        return cls(best[1])

    @classmethod
    def anchored(cls, monotonic_ts: float, wall_ts: float) -> "ClockOffset":
        """The offset that maps ``monotonic_ts`` onto ``wall_ts``."""
        return cls(wall_ts - monotonic_ts)

    def to_wall(self, monotonic_ts: float) -> float:
        return monotonic_ts + self.wall_minus_monotonic


def to_ns(seconds: float) -> int:
    return int(round(seconds * 1e9))
