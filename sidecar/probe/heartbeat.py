"""What a probe's heartbeat says, built on the link thread every 2 s, and when one goes early.

The step count (the sidecar's step rate comes from it), the always-on sync watch's report when it
has changed since the sidecar last got one, how long the running step has run, the slowest step
since the last heartbeat, the watchdog's report of a stuck step, and the requests in flight. Two
pieces of it depend on what this connection's sidecar has already been told (the watch's version,
the step ring's rows read); ``reset`` forgets both when the link drops, so a new sidecar, or the same
one restarted, is told again.

The step alarm (issue 30): the sidecar's ``step_alarm`` gives the lowest threshold of its rules on
one slow step. While one is set, the link thread calls ``early`` every ``link.EARLY_POLL_S`` (0.1 s);
it reads the step ring's rows written since it last looked (the rows the step path writes anyway:
nothing is added to the step path) and says a heartbeat should go now when one of those steps ran
longer than the threshold, at most once every ``EARLY_MIN_INTERVAL_S``, so that an engine whose
every step is slow sends five heartbeats a second at most, not one per step. The early heartbeat
is a whole one (``build``): its slowest step is that step or a slower one, and the sidecar's triggers
evaluate it as they do every heartbeat. The alarm ends with the link (``reset``): the next
sidecar says its own.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from .flight_ring import StepRing
from ..common.protocol import Heartbeat, InFlight
from .watchdog import Watchdog

log = logging.getLogger(__name__)

# At most one early heartbeat this often (s): a slow step waits at most this long for its report
# after another slow step's, and an engine of slow steps cannot flood the channel.
EARLY_MIN_INTERVAL_S = 0.2


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
        # The step alarm: the threshold (ms; None: none set on this connection), the rows ``early``
        # has looked at, whether a step over it waits for a heartbeat, when the last early one went.
        self._alarm_ms: float | None = None
        self._alarm_read = 0
        self._alarm_pending = False
        self._early_at = float("-inf")

    @property
    def alarm_ms(self) -> float | None:
        """The step alarm's threshold now (ms), None when none is set."""
        return self._alarm_ms

    def set_step_alarm(self, threshold_ms: float | None) -> None:
        """The sidecar's ``step_alarm`` (link thread). Steps that ended before the alarm was first set
        on this connection are history: the next heartbeat's slowest step, and ``early``, count
        from now (without this, a slow step before the connection's first regular heartbeat would
        be dropped by that heartbeat as history, though the sidecar is listening)."""
        ring = self._ring
        if ring is None:
            return
        if threshold_ms is not None and self._alarm_ms is None:
            if self._slowest_read is None:
                self._slowest_read = ring.written
            self._alarm_read = max(self._slowest_read, self._alarm_read)
        self._alarm_ms = threshold_ms
        if threshold_ms is None:
            self._alarm_pending = False

    def early(self, now: float) -> bool | None:
        """Whether a heartbeat should go now (``now``: ``time.monotonic()``), on the link thread: None
        when no alarm is set (nothing to watch: the link waits for the next beat), else True when a
        step longer than the alarm's threshold ended since the last heartbeat and no early one went
        in the last ``EARLY_MIN_INTERVAL_S``. Reads only the rows written since the last call."""
        ring, threshold = self._ring, self._alarm_ms
        if ring is None or threshold is None:
            return None
        if not self._alarm_pending and ring.written != self._alarm_read:
            # The same measure as the heartbeat's slowest step, so the sidecar sees what this saw.
            slowest_ms, _, self._alarm_read = ring.slowest_since(self._alarm_read)
            self._alarm_pending = slowest_ms is not None and slowest_ms > threshold
        if not self._alarm_pending or now - self._early_at < EARLY_MIN_INTERVAL_S:
            return False
        self._early_at, self._alarm_pending = now, False  # the caller sends the heartbeat now
        return True

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
            # This heartbeat reports every step up to here: the alarm need not look at them again.
            self._alarm_read, self._alarm_pending = self._slowest_read, False
        stuck = self._watchdog.check() if self._watchdog is not None else None
        return Heartbeat(steps=self._steps(), sync_watch=self._sync_watch(), open_step_ms=open_step_ms,
                         stuck=stuck, in_flight=self._in_flight_summary(), slowest_step_ms=slowest_ms,
                         slowest_step=slowest_step)

    def reset(self) -> None:
        """The link dropped: the next sidecar has been told nothing yet."""
        self._watch_sent = -1
        self._slowest_read = None
        self._alarm_ms, self._alarm_pending = None, False

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
