"""What a probe's heartbeat says, built on the link thread every 2 s.

The step count (the sidecar's step rate comes from it), the always-on sync watch's report when it
has changed since the sidecar last got one, how long the running step has run, the slowest step
since the last heartbeat, the watchdog's report of a stuck step, and the requests in flight. Two
pieces of it depend on what this connection's sidecar has already been told (the watch's version,
the step ring's rows read); ``reset`` forgets both when the link drops, so a new sidecar, or the same
one restarted, is told again.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .flight_ring import StepRing
from ..common.protocol import Heartbeat, InFlight
from .watchdog import Watchdog

log = logging.getLogger(__name__)


class HeartbeatSource:
    def __init__(
        self,
        steps: Callable[[], int],
        *,
        watch: Any = None,
        watch_note: str | None = None,
        ring: StepRing | None = None,
        watchdog: Watchdog | None = None,
        in_flight: Callable[[], list[dict]] | None = None,
    ) -> None:
        """``steps``: the process's working-step count. ``watch``: the always-on sync watch (None:
        off, with ``watch_note`` saying why where it was asked for and could not run)."""
        self._steps = steps
        self._watch, self._watch_note = watch, watch_note
        self._ring, self._watchdog, self._in_flight = ring, watchdog, in_flight
        self._watch_sent = -1  # the watch version the sidecar last received (-1: none since connecting)
        # The step ring's rows the heartbeats have looked at; None: none yet on this connection, so the
        # first heartbeat starts from now: steps taken before it (warm-up, or while no sidecar listened)
        # are history, which /recorder shows, not new events for a trigger.
        self._slowest_read: int | None = None

    def build(self) -> Heartbeat:
        ring = self._ring
        open_step_ms = None
        if ring is not None and (since := ring.open_since_ns):
            open_step_ms = max(0.0, (time.time_ns() - since) / 1e6)
        slowest_ms = slowest_step = None
        if ring is not None:
            if self._slowest_read is None:
                self._slowest_read = ring.written
            slowest_ms, slowest_step, self._slowest_read = ring.slowest_since(self._slowest_read)
        stuck = self._watchdog.check() if self._watchdog is not None else None
        return Heartbeat(steps=self._steps(), sync_watch=self._sync_watch(), open_step_ms=open_step_ms,
                         stuck=stuck, in_flight=self._in_flight_summary(), slowest_step_ms=slowest_ms,
                         slowest_step=slowest_step)

    def reset(self) -> None:
        """The link dropped: the next sidecar has been told nothing yet."""
        self._watch_sent = -1
        self._slowest_read = None

    def _sync_watch(self) -> dict[str, Any] | None:
        watch = self._watch
        if watch is not None and watch.version != self._watch_sent:
            self._watch_sent = watch.version
            return watch.report()
        if self._watch_note is not None and self._watch_sent == -1:
            self._watch_sent = 0
            return {"state": "unavailable", "reason": self._watch_note, "sites": []}
        return None

    def _in_flight_summary(self) -> InFlight | None:
        if self._in_flight is None:
            return None
        try:
            requests = self._in_flight()
        except Exception as exc:
            log.debug("inference-sidecar: requests in flight not read: %s", exc)
            return None
        arrivals = [r["arrived_ns"] for r in requests if r.get("arrived_ns")]
        return InFlight(count=len(requests), oldest_arrival_ns=min(arrivals) if arrivals else None)
