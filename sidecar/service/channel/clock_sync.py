"""Each probe's clock against the sidecar's, from the probe channel's round trips, as NTP does.

The sidecar sends ``clock {seq}`` and notes its wall clock (``time.time_ns()``) when sending (``t1``)
and when the ``clock_reply`` arrives (``t2``); the probe's link thread answers at once with its own
wall clock ``p``. If the message took as long each way, the probe read its clock at ``(t1 + t2) / 2``
of the sidecar's, so its offset is ``p - (t1 + t2) / 2``; whatever the asymmetry, the true offset
lies within half the round trip of that: the sample's uncertainty. Round trips vary (a busy event
loop, the GIL held by the engine's step), so the estimate is the sample with the *shortest* round
trip among the latest ``KEEP`` (NTP's clock filter): its bound is the tightest.

On one host every process reads the same clock, so ``t1 <= p <= t2`` and the offset never exceeds
its uncertainty: an offset is applied to a trace only when it does (``significant``), and a local
process's trace is never moved by the noise of its round trips.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ...common.protocol import ClockProbe, ClockReply

log = logging.getLogger(__name__)

KEEP = 16  # samples the estimate chooses from
FIRST_PROBES = 5  # sent at connection, ``FIRST_GAP_S`` apart, so an estimate exists within a second
FIRST_GAP_S = 0.1
EVERY_S = 10.0  # then one per interval: clocks drift by parts per million, so this is plenty
MAX_PENDING = 64  # probes unanswered at once (a probe that never replies cannot grow the table)


@dataclass(frozen=True)
class ClockSample:
    offset_ns: int  # the probe's clock minus the sidecar's
    uncertainty_ns: int  # half the round trip: the true offset is within this of ``offset_ns``
    at_ns: int  # the sidecar's clock when the reply arrived


class ClockEstimate:
    """One probe connection's clock offset (event loop only)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._seqs = itertools.count(1)
        self._pending: dict[int, int] = {}  # seq -> the sidecar's clock when it was sent
        self._samples: deque[ClockSample] = deque(maxlen=keep)

    def probe(self, now_ns: int | None = None) -> ClockProbe:
        """The next ``clock`` message to send, noted as sent now."""
        if len(self._pending) >= MAX_PENDING:
            self._pending.pop(next(iter(self._pending)))  # the oldest unanswered: lost
        seq = next(self._seqs)
        self._pending[seq] = time.time_ns() if now_ns is None else now_ns
        return ClockProbe(seq=seq)

    def on_reply(self, reply: ClockReply, now_ns: int | None = None) -> ClockSample | None:
        """Take a reply; None for one not sent on this connection (or already taken)."""
        sent = self._pending.pop(reply.seq, None)
        if sent is None:
            return None
        arrived = time.time_ns() if now_ns is None else now_ns
        round_trip = max(0, arrived - sent)
        sample = ClockSample(offset_ns=reply.probe_ns - (sent + arrived) // 2,
                             uncertainty_ns=(round_trip + 1) // 2, at_ns=arrived)
        self._samples.append(sample)
        return sample

    @property
    def best(self) -> ClockSample | None:
        """The sample with the shortest round trip among the latest ones; None before any reply."""
        return min(self._samples, key=lambda s: s.uncertainty_ns, default=None)

    @property
    def significant(self) -> bool:
        """The offset exceeds its uncertainty: the clocks really differ (never on one host)."""
        best = self.best
        return best is not None and abs(best.offset_ns) > best.uncertainty_ns

    @property
    def correction_ns(self) -> int:
        """What to subtract from this process's times to put them on the sidecar's clock: the offset
        where ``significant``, else 0."""
        best = self.best
        return best.offset_ns if best is not None and abs(best.offset_ns) > best.uncertainty_ns else 0

    def to_json(self) -> dict[str, Any] | None:
        """``{offset_ms, uncertainty_ms, applied, samples}`` for ``/processes`` and captures; None
        before any reply."""
        best = self.best
        if best is None:
            return None
        return {"offset_ms": round(best.offset_ns / 1e6, 3), "uncertainty_ms": round(best.uncertainty_ns / 1e6, 3),
                "applied": self.significant, "samples": len(self._samples)}


async def keep_probing(estimate: ClockEstimate, send: Callable[[ClockProbe], Awaitable[bool]],
                       first: int = FIRST_PROBES, first_gap_s: float = FIRST_GAP_S, every_s: float = EVERY_S) -> None:
    """Send clock probes for as long as the connection lasts (cancelled with it): a few at once, then
    one per ``every_s``. Stops when a send fails (the connection is going)."""
    for i in itertools.count():
        if not await send(estimate.probe()):
            return
        await asyncio.sleep(first_gap_s if i + 1 < first else every_s)
