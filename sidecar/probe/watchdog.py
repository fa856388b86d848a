"""The step watchdog: a step that has not ended after ``threshold_s`` is reported stuck, once per step.

It runs on the probe's link thread at each heartbeat (every 2 s), never on the step thread, so it
works when the step thread is blocked inside a forward that never returns. When it fires it takes one
snapshot of the process's Python stacks (sidecar/stacks/threads.py), logs the step thread's stack as a
warning and keeps the report, which every following heartbeat carries until the step ends: the
sidecar shows it on ``/healthz`` and as ``sidecar_engine_step_stuck``. Off unless
``SIDECAR_WATCHDOG_S`` (or the constructor) gives a threshold.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Callable, Mapping

from ..common import config

log = logging.getLogger(__name__)

MAX_LOGGED_FRAMES = 30


def threshold_from_environment(env: Mapping[str, str] | None = None) -> float:
    """``SIDECAR_WATCHDOG_S`` in seconds; 0 (off) when unset or 0. A bad value is logged as an error
    naming the variable and the watchdog stays off: a typo must not stop an engine."""
    raw = ((os.environ if env is None else env).get(config.ENV_WATCHDOG_S) or "").strip()
    if raw in ("", "off") or re.fullmatch(r"0*\.?0+", raw):  # "0", "0.0", ".0": off, said plainly
        return 0.0
    return config.env_number(config.ENV_WATCHDOG_S, 0.0, env=env)


class Watchdog:
    def __init__(self, threshold_s: float, open_since_ns: Callable[[], int], running_step: Callable[[], int],
                 snapshot: Callable[[], dict], clock_ns: Callable[[], int] = time.time_ns) -> None:
        """``open_since_ns``: when the running step began (unix ns, 0 between steps);
        ``running_step``: its number; ``snapshot``: every thread's stack (thread_stacks.snapshot)."""
        if threshold_s <= 0:
            raise ValueError("the watchdog's threshold must be positive")
        self.threshold_s = threshold_s
        self._open_since_ns = open_since_ns
        self._running_step = running_step
        self._snapshot = snapshot
        self._clock_ns = clock_ns
        self._report: dict[str, Any] | None = None
        self.fired = 0  # steps reported stuck since the probe started

    def check(self) -> dict[str, Any] | None:
        """The stuck step's report while a step has run over the threshold, else None."""
        since = self._open_since_ns()
        if not since:
            self._report = None
            return None
        age_s = (self._clock_ns() - since) / 1e9
        if age_s < self.threshold_s:
            return None
        if self._report is None or self._report["since_ns"] != since:
            self._report = self._fire(since, age_s)
        return {**self._report, "age_s": round(age_s, 3)}

    def _fire(self, since: int, age_s: float) -> dict[str, Any]:
        self.fired += 1
        step = self._running_step()
        try:
            threads = self._snapshot().get("threads", [])
        except Exception as exc:  # the report must not depend on the snapshot
            log.warning("inference-sidecar: watchdog: stacks not taken: %s", exc)
            threads = []
        step_thread = next((t for t in threads if t.get("step_thread")), None)
        frames = step_thread["frames"] if step_thread else []
        shown = "\n".join(f"    {f['function']} ({f['file']}:{f['line']})" for f in reversed(frames[-MAX_LOGGED_FRAMES:]))
        log.warning("inference-sidecar: step %d has run for %.1f s (watchdog at %g s); the step thread is in:\n%s",
                    step, age_s, self.threshold_s, shown or "    (no stack: the step thread was not found)")
        return {"since_ns": since, "step": step, "threshold_s": self.threshold_s, "frames": frames,
                "threads": len(threads)}
