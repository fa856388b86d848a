"""One costly query at a time per engine process, on the sidecar's side (docs/api.md, "Incidents").

Why: each ``/stacks?seconds=N`` starts a sampler thread inside the engine process (up to 60 s; at
1 kHz it holds the GIL a third of the time, sidecar/stacks/threads.py), a recorder dump writes tens of
MiB of JSON there, and ``mode=native`` has py-spy stop it to read its memory. Ten callers at once
would be ten of those in the engine. So every probe connection has one slot, shared by a stacks
snapshot, a stacks sampling, a native dump and a recorder dump; ``/requests`` (cheap, answered on
the probe's link thread) takes none.

An HTTP request takes the slots of every process it selects, or none: when any is held it gets
``ProbesBusy`` at once (the routes answer 429 with ``Retry-After``) rather than waiting behind a
minute of sampling. A trigger's recorder dump has nobody to retry it, so it waits for the slots
instead (``hold_when_free``, sidecar/service/incidents/recorder_dump.py). The probe refuses a second costly query too
(sidecar/probe/queries.py): this half keeps well-behaved callers from piling up, that half is what
guarantees the engine never runs two.

The slots live on the app's ``QueryBroker`` (``queries.slots``), keyed by connection id, never in
module state. A probe that leaves frees its slot (``free``); a reconnected probe is a new
connection with a slot of its own. Everything runs on the event loop, and checking and taking every
slot of a request is one step with no ``await`` in between, so two requests never both find a
process free.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Iterator

if TYPE_CHECKING:
    from .registry import ProbeConnection

BUSY_ERROR = "query_in_progress"  # the 429's ``error``

# A probe's refusal (sidecar/probe/queries.py ``busy_error``) starts "busy: " and ends "(N s left)":
# read here to answer 429 with that Retry-After.
_PROBE_BUSY = re.compile(r"^busy: .*\((\d+) s left\)")


@dataclass(frozen=True)
class Work:
    """What holds a slot. ``what`` completes "<process> is running ..." ("a stacks sampling of 60 s");
    ``expected_s``: how long it should take from its start (a sampling's seconds; 0 for a one-shot
    snapshot or dump), for an honest ``Retry-After``."""

    what: str
    expected_s: float = 0.0


@dataclass(eq=False)
class Holding:
    """One connection's slot taken by one piece of work. Each connection has its own, so that a
    probe's loss wakes those waiting for that probe alone."""

    work: Work
    started: float = field(default_factory=time.monotonic)
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def left_s(self, now: float) -> float:
        return self.started + self.work.expected_s - now


class ProbesBusy(Exception):
    """Some of the selected processes have a costly query in flight: who, running what, and when to retry."""

    def __init__(self, busy: list[tuple["ProbeConnection", Holding]]) -> None:
        now = time.monotonic()
        self.held = busy
        # At least 1 s: a snapshot or a dump past its estimate is still about to end, not over.
        self.retry_after_s = max(1, math.ceil(max(h.left_s(now) for _, h in busy)))
        self.processes = [{"process": c.identity.label, "running": h.work.what, "running_s": round(now - h.started, 3)}
                          for c, h in busy]
        running = "; ".join(f"{p['process']} is running {p['running']} (for {p['running_s']:.0f} s)"
                            for p in self.processes)
        super().__init__(f"{running}: one stacks or recorder query at a time per process; "
                         f"retry in {self.retry_after_s} s")


class QuerySlots:
    def __init__(self) -> None:
        self._held: dict[int, Holding] = {}  # connection id -> its slot's holding

    def busy(self, conns: list["ProbeConnection"]) -> list[tuple["ProbeConnection", Holding]]:
        """The connections among ``conns`` whose slot is held, with what holds it."""
        return [(c, self._held[c.id]) for c in conns if c.id in self._held]

    @contextlib.contextmanager
    def hold(self, conns: list["ProbeConnection"], work: Work) -> Iterator[None]:
        """Hold every connection's slot for the block; ``ProbesBusy`` at once when any is held."""
        busy = self.busy(conns)
        if busy:
            raise ProbesBusy(busy)
        mine = {c.id: Holding(work) for c in conns}
        self._held.update(mine)
        try:
            yield
        finally:
            for conn_id, holding in mine.items():
                if self._held.get(conn_id) is holding:  # free() may have dropped it (the probe left)
                    del self._held[conn_id]
                holding.released.set()

    @contextlib.asynccontextmanager
    async def hold_when_free(self, conns: list["ProbeConnection"], work: Work,
                             wait_s: float) -> AsyncIterator[tuple[list["ProbeConnection"], ProbesBusy | None]]:
        """Wait up to ``wait_s`` for every connection's slot, then hold those that are free for the
        block. Yields (the connections held, ``ProbesBusy`` naming the others or None)."""
        deadline = time.monotonic() + wait_s
        while busy := self.busy(conns):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:  # woken when that slot is given back (or its probe leaves), then all are checked again
                await asyncio.wait_for(busy[0][1].released.wait(), left)
            except asyncio.TimeoutError:
                pass
        busy = self.busy(conns)
        taken = {c.id for c, _ in busy}
        free = [c for c in conns if c.id not in taken]
        with self.hold(free, work):
            yield free, ProbesBusy(busy) if busy else None

    def free(self, conn: "ProbeConnection") -> None:
        """The probe left: its slot is free (whatever held it learns of the loss by its own way)."""
        holding = self._held.pop(conn.id, None)
        if holding is not None:
            holding.released.set()


def probe_busy_retry_s(error: str | None) -> int | None:
    """The seconds a probe's ``busy:`` refusal says to wait; None for any other error."""
    match = _PROBE_BUSY.match(error or "")
    return max(1, int(match.group(1))) if match else None
