"""Process CPU time and resident memory through psutil (called by the sampler thread)."""

from __future__ import annotations

import psutil
from opentelemetry.metrics import Meter

from .instruments import PROCESS_CPU_TIME, PROCESS_MEMORY_USAGE


class ProcessSampler:
    def __init__(self, meter: Meter, process: psutil.Process | None = None) -> None:
        self._process = process or psutil.Process()
        self._cpu = meter.create_counter(PROCESS_CPU_TIME, unit="s", description="Total CPU seconds by mode.")
        self._rss = meter.create_gauge(PROCESS_MEMORY_USAGE, unit="By",
                                       description="The amount of physical memory in use (resident set size).")
        self._last = {"user": 0.0, "system": 0.0}

    def sample(self) -> None:
        with self._process.oneshot():
            times = self._process.cpu_times()
            rss = self._process.memory_info().rss
        for mode, value in (("user", times.user), ("system", times.system)):
            delta = value - self._last[mode]
            if delta > 0:
                self._cpu.add(delta, {"cpu.mode": mode})
                self._last[mode] = value
        self._rss.set(rss)
