"""The flight recorder's last minutes, kept by the sidecar for the home page's chart (``GET
/recorder/timeline``, recorder_timeline.py), read from the engine a few seconds at a time.

Why a store: the page refreshes every few seconds while it is open, and a plain recorder read makes
every probe copy its whole window (a full step ring is 65,536 rows, 5 MiB; rows travel packed,
``Query.packed``, and this process makes their columns). Here the first read of a window asks for it whole, once; every later
read asks each probe only for the rows that ended since the previous read (``Query.since_ns``, less
``OVERLAP_NS`` for a row written just after a read began: a request is added to its ring a moment
after its finish time), and the answers' rows are appended to a per-process copy, duplicates dropped.
A probe older than ``since_ns`` sends its last seconds instead: the same rows, cut the same way.

Bounds: per process at most ``MAX_STEP_ROWS`` steps, ``MAX_GC_ROWS`` GC pauses and
``MAX_REQUEST_ROWS`` finished requests, none older than the window last asked for; columns are
``array('q')`` (8 bytes a value, not a Python int each). The whole store is dropped when no page has
asked for ``IDLE_S``, and a process's part when its connection goes.

Single flight: every open tab reads through one ``RecorderWindows``; while a refresh is under way
the others wait for it and share its rows, and a read within ``FRESH_S`` of the last one is served
from the store without asking the engine at all. A refresh takes each probe's slot for costly
queries (sidecar/service/channel/query_slots.py) without waiting: a process busy with a stacks
sampling or a download keeps its rows of the last read, and says so (``note``).
"""

from __future__ import annotations

import asyncio
import time
from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...common.protocol import MAX_QUERY_SECONDS
from ..channel.queries import QueryBroker
from ..channel.query_slots import Work
from .recorder_dump import RECORDER_TIMEOUT_S, read_reply

OVERLAP_NS = 2_000_000_000  # each incremental read reaches this far back before the last one
FRESH_S = 1.0  # reads closer together than this share the last refresh
IDLE_S = 60.0  # no read for this long: the store is dropped
MAX_STEP_ROWS = 1 << 18  # 20 MiB of ten columns per process, four ring's worth at the default capacity
MAX_GC_ROWS = 1 << 14
MAX_REQUEST_ROWS = 1 << 16
WORK = Work("the home page's recorder read")


def _column(values: list) -> array | list:
    """Integers as one ``array('q')``; a column of anything else (a field a newer probe adds) as a list."""
    try:
        return array("q", values)
    except (TypeError, OverflowError):
        return list(values)


def _newer_than(keys: list[int], last: Optional[int]) -> int:
    """The index of the first key after ``last`` in keys that are in order (write order, clock order)."""
    return 0 if last is None else bisect_right(keys, last)


@dataclass(eq=False)
class ProcessRows:
    """One engine process's recorder rows held between reads, oldest first, on the sidecar's clock."""

    process: dict[str, Any]
    steps: dict[str, Any] = field(default_factory=dict)  # column name -> values (the dump's step columns)
    gc: dict[str, Any] = field(default_factory=dict)  # GC_FIELDS -> values
    requests: list[tuple] = field(default_factory=list)  # (id, arrived, first token, finished, outcome, prompt, output)
    in_flight: list[dict] = field(default_factory=list)
    open_since_ns: int = 0
    capacity: Optional[int] = None
    complete_since_ns: int = 0  # every row ending from here on is held (sidecar clock)
    read_ns: int = 0  # when the last read that answered was asked (sidecar clock)
    error: Optional[str] = None  # why the last read gave nothing (the rows are those of an earlier one)
    note: Optional[str] = None  # e.g. busy: what kept the last read from this process

    @property
    def step_count(self) -> int:
        return len(self.steps.get("end_ns", ()))

    def absorb(self, dump: dict, since_ns: int, asked_ns: int, *, whole: bool) -> None:
        """Rows of ``dump`` (a probe's, on the sidecar's clock) asked from ``since_ns`` at ``asked_ns``;
        ``whole``: a first read of the window, which replaces what was held."""
        if whole:
            self.steps, self.gc, self.requests = {}, {}, []
            self.complete_since_ns = since_ns
        ring = dump.get("steps") or {}
        self._add_steps(ring.get("steps") or {})
        self.open_since_ns = ring.get("open_since_ns") or 0
        self.capacity = ring.get("capacity", self.capacity)
        self._add_gc(dump.get("gc") or {})
        self._add_requests(dump.get("requests") or {}, since_ns)
        self.in_flight = list(dump.get("in_flight") or [])
        self.read_ns, self.error, self.note = asked_ns, None, None

    def _add_steps(self, columns: dict) -> None:
        ends = columns.get("end_ns")
        if not ends:
            return
        if self.steps and set(self.steps) != set(columns):  # another probe version's columns: start afresh
            self.steps = {}
        held = self.steps.get("end_ns")
        first = _newer_than(ends, held[-1] if held else None)
        for name, values in columns.items():
            if name in self.steps:
                self.steps[name].extend(values[first:])
            else:
                self.steps[name] = _column(values[first:])

    def _add_gc(self, columns: dict) -> None:
        starts, durations = columns.get("start_ns"), columns.get("duration_ns")
        if not starts or durations is None:
            return
        ends = [s + d for s, d in zip(starts, durations)]
        held = self.gc.get("start_ns")
        last = held[-1] + self.gc["duration_ns"][-1] if held else None
        first = _newer_than(ends, last)
        for name, values in columns.items():
            if isinstance(values, list):  # the totals are scalars
                self.gc.setdefault(name, _column([])).extend(values[first:])

    def _add_requests(self, columns: dict, since_ns: int) -> None:
        names = ("id", "arrived_ns", "first_token_ns", "finished_ns", "outcome", "prompt_tokens", "output_tokens")
        if not columns.get("finished_ns") or any(n not in columns for n in names):
            return
        # A request joins its ring a moment after its finish time, not always in finish order: the
        # overlap of two reads is compared by identity, not by time.
        seen = {(r[0], r[3]) for r in self.requests if r[3] >= since_ns}
        for row in zip(*(columns[n] for n in names)):
            if (row[0], row[3]) not in seen:
                self.requests.append(row)

    def trim(self, horizon_ns: int) -> None:
        """Drop the rows that ended before ``horizon_ns``, and the oldest past each bound."""
        ends = self.steps.get("end_ns")
        if ends:
            cut = max(self._before(ends, horizon_ns), len(ends) - MAX_STEP_ROWS)
            if cut > 0:
                for values in self.steps.values():
                    del values[:cut]
        starts = self.gc.get("start_ns")
        if starts:
            cut = max(self._before(starts, horizon_ns), len(starts) - MAX_GC_ROWS)
            if cut > 0:
                for values in self.gc.values():
                    del values[:cut]
        if self.requests:
            kept = [r for r in self.requests if r[3] >= horizon_ns]
            self.requests = kept[-MAX_REQUEST_ROWS:]
        self.complete_since_ns = max(self.complete_since_ns, horizon_ns)

    @staticmethod
    def _before(keys, horizon_ns: int) -> int:
        """How many of the first keys are before the horizon (keys in order; a stepped clock ends the run)."""
        n = 0
        for value in keys:
            if value >= horizon_ns:
                break
            n += 1
        return n


@dataclass(frozen=True)
class Snapshot:
    """What one read gives the timeline: every connected process's rows, and when they were read."""

    processes: list[ProcessRows]
    read_ns: int  # the sidecar's time of the refresh these rows come from
    asked_probes: bool  # whether this read asked the engine (False: served from the store)


class RecorderWindows:
    """The store and its refreshes (module docstring). One per app; everything on the event loop."""

    def __init__(self, *, clock_ns: Callable[[], int] = time.time_ns, fresh_s: float = FRESH_S,
                 idle_s: float = IDLE_S) -> None:
        self._clock_ns = clock_ns
        self._fresh_s = fresh_s
        self._idle_s = idle_s
        self._rows: dict[int, ProcessRows] = {}  # by connection id
        self._flight: Optional[asyncio.Task] = None
        self._refreshed_at = float("-inf")  # monotonic time of the last refresh's end
        self._reach_ns = 0  # the window (ns) the held rows are complete for
        self._windows: dict[int, float] = {}  # each window (ns) asked for -> when last (monotonic)
        self._read_ns = 0
        self._last_asked = 0.0
        self._idle_timer: Optional[asyncio.TimerHandle] = None
        self.refreshes = 0  # refreshes that asked the engine (tests, benchmarks)
        self.probe_queries = 0  # recorder queries sent to probes by them
        self.whole_reads = 0  # of those, the ones that asked for a whole window

    def held_processes(self) -> int:
        return len(self._rows)

    async def read(self, queries: QueryBroker, conns: list, seconds: float) -> Snapshot:
        """The rows of the last ``seconds`` of ``conns``, refreshed unless a read within ``FRESH_S``
        covered them; shares a refresh under way."""
        self._last_asked = time.monotonic()
        self._arm_idle_timer()
        window_ns = int(seconds * 1e9)
        self._windows[window_ns] = self._last_asked
        wanted = {c.id for c in conns}
        while True:
            flight = self._flight
            if flight is not None and not flight.done():  # another tab's refresh: wait for it, then look again
                await asyncio.shield(flight)
                continue
            fresh = time.monotonic() - self._refreshed_at < self._fresh_s
            if fresh and self._reach_ns >= window_ns and wanted <= set(self._rows):
                return Snapshot([self._rows[c.id] for c in conns], self._read_ns, asked_probes=False)
            # Checked and started with no await between: one refresh at a time.
            flight = asyncio.get_running_loop().create_task(self._refresh(queries, conns, window_ns))
            self._flight = flight
            await asyncio.shield(flight)
            return Snapshot([self._rows[c.id] for c in conns if c.id in self._rows], self._read_ns,
                            asked_probes=True)

    async def _refresh(self, queries: QueryBroker, conns: list, window_ns: int) -> None:
        try:
            await self._ask(queries, conns, window_ns)
        finally:
            self._refreshed_at = time.monotonic()
            self._flight = None

    async def _ask(self, queries: QueryBroker, conns: list, window_ns: int) -> None:
        now = self._clock_ns()
        # The widest window a page asked for lately is kept: tabs on 1 and 60 minutes share one store.
        recent = time.monotonic() - self._idle_s
        self._windows = {w: t for w, t in self._windows.items() if t >= recent}
        window_ns = max([window_ns, *self._windows])
        horizon = now - window_ns
        for gone in set(self._rows) - {c.id for c in conns}:
            del self._rows[gone]
        async with queries.slots.hold_when_free(conns, WORK, 0) as (free, busy):
            asks = []
            for conn in free:
                held = self._rows.get(conn.id)
                whole = held is None or held.complete_since_ns > horizon or held.read_ns == 0
                since = horizon if whole else max(horizon, held.read_ns - OVERLAP_NS)
                fields: dict[str, Any] = {"kind": "recorder", "packed": True,
                                          "seconds": min(MAX_QUERY_SECONDS, (now - since) / 1e9 + 1.0)}
                if not whole:  # on the probe's clock: the sidecar's moved back by its measured offset
                    fields["since_ns"] = max(1, since + conn.clock.correction_ns)
                asks.append((conn, since, whole, queries.ask([conn], fields, RECORDER_TIMEOUT_S)))
            self.refreshes += 1
            self.probe_queries += len(asks)
            self.whole_reads += sum(1 for _, _, whole, _ in asks if whole)
            replies = await asyncio.gather(*(ask for *_, ask in asks))
            for (conn, since, whole, _), (reply,) in zip(asks, replies):
                process, dump, error = await read_reply(reply)
                rows = self._rows.get(conn.id) or ProcessRows(process)
                rows.process = process
                if isinstance(dump, dict):
                    rows.absorb(dump, since, now, whole=whole)
                else:
                    rows.error = error or "no recorder dump"
                self._rows[conn.id] = rows
            for conn, holding in busy.held if busy else ():
                rows = self._rows.setdefault(conn.id, ProcessRows(conn.to_json()))
                rows.note = f"busy: running {holding.work.what}; its rows are those of the last read"
        for rows in self._rows.values():
            rows.trim(horizon)
        self._reach_ns, self._read_ns = window_ns, now

    # -- dropped when idle -------------------------------------------------------------------------
    def _arm_idle_timer(self) -> None:
        if self._idle_timer is None:
            self._idle_timer = asyncio.get_running_loop().call_later(self._idle_s, self._idle_check)

    def _idle_check(self) -> None:
        self._idle_timer = None
        idle_for = time.monotonic() - self._last_asked
        if idle_for >= self._idle_s and (self._flight is None or self._flight.done()):
            self.drop()
        else:
            self._idle_timer = asyncio.get_running_loop().call_later(max(0.1, self._idle_s - idle_for),
                                                                     self._idle_check)

    def drop(self) -> None:
        """Forget every row (no page has asked for a while)."""
        self._rows.clear()
        self._windows.clear()
        self._reach_ns, self._refreshed_at = 0, float("-inf")

    def close(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.drop()
