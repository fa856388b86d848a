"""One background thread that runs periodic tasks (hardware samplers, the step drain) off the step path."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class PeriodicTasks:
    """Runs each ``(interval_s, task)`` about every ``interval_s`` on a daemon thread.

    A task that raises is logged once and keeps being called (a transient failure should not end it).
    """

    def __init__(self, name: str = "sidecar-telemetry-sampler") -> None:
        self._tasks: list[list] = []  # [interval, next_due, task, failed_before]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def add(self, interval_s: float, task: Callable[[], None]) -> "PeriodicTasks":
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._tasks.append([interval_s, 0.0, task, False])
        return self

    def start(self) -> "PeriodicTasks":
        if self._tasks:
            self._thread.start()
        return self

    def run_once(self) -> None:
        """Run every task now (tests, and a last pass at shutdown)."""
        for entry in self._tasks:
            self._call(entry)

    def _call(self, entry: list) -> None:
        try:
            entry[2]()
        except Exception:
            if not entry[3]:
                entry[3] = True
                log.warning("inference-sidecar: telemetry task %r failed (logged once)", entry[2], exc_info=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for entry in self._tasks:
                if now >= entry[1]:
                    entry[1] = now + entry[0]
                    self._call(entry)
            wait = min(entry[1] for entry in self._tasks) - time.monotonic()
            self._stop.wait(max(wait, 0.001))

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
