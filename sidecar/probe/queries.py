"""A probe's answers to the sidecar's queries: the flight recorder, Python stacks, requests in flight.

Every query is answered off the step thread: a snapshot of stacks and the requests in flight on the
link thread (a few ms), a stacks sampling and a recorder dump on a short-lived thread of their own
(so the link keeps its heartbeats, and the export thread, which may be writing a capture, is not
waited for). That is what lets a process whose step thread is stuck inside a forward still answer.

A recorder dump can be larger than a channel frame, so it is written to a file and the answer names
it: ``<trace root>/recorder/<stem>-q<id>.msgpack`` (capture/trace_root.py) when the query asks for packed
rows (``Query.packed``: the rings' bytes, one msgpack encoding; the sidecar makes the columns), else
JSON in ``<stem>-q<id>.json``. The sidecar reads it and deletes it. One the sidecar never took (it timed out, or restarted) is deleted
by the process's next dump. Stacks and requests travel inline.

One stacks or recorder query at a time: while a sampling or a dump runs, any other stacks query (a
snapshot too) or recorder query is answered at once with a ``busy:`` error (``busy_error``) and nothing
is started, so the engine never holds two samplers, whatever the sidecar sends (one that ignores its
own slot, service/query_slots.py, or a relay that injects frames). The slot is taken on the link
thread, where every query arrives, and freed by the query's thread before its answer is sent: the
sidecar may ask again the moment it has the answer. ``requests`` (a few ms, inline) is never refused.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from ..common.protocol import Answer, Query
from ..common.step_window import clip
from ..stacks import threads as thread_stacks

log = logging.getLogger(__name__)

# An inline answer's data is held under this many bytes of JSON: the sidecar's frame limit is 1 MiB.
MAX_INLINE_BYTES = 900_000
DUMP_SUFFIXES = (".json", ".json.tmp", ".msgpack", ".msgpack.tmp")  # what _remove_older_dumps removes


def busy_error(what: str, left_s: float) -> str:
    """The answer to a stacks or recorder query while ``what`` runs, expected to end in ``left_s``. The
    sidecar reads the "busy: " and the seconds left for its 429's Retry-After (service/query_slots.py)."""
    return (f"busy: {what} is already running in this process ({max(1, math.ceil(left_s))} s left); "
            f"one stacks or recorder query at a time")


@dataclass(frozen=True)
class _Running:
    """The stacks sampling or recorder dump a probe is running: named in the refusals it causes."""

    what: str
    expected_s: float = 0.0  # how long it should take from its start (a sampling's seconds)
    started: float = field(default_factory=time.monotonic)

    def refusal(self) -> str:
        return busy_error(self.what, self.started + self.expected_s - time.monotonic())


class QueryAnswerer:
    def __init__(self, *, send: Callable[[Answer], None], recorder_dump: Callable[..., dict],
                 recorder_file: Callable[[int], str], step_thread_id: Callable[[], int | None],
                 in_flight: Callable[[], list[dict]] | None) -> None:
        """``recorder_dump(seconds, since_ns=0, packed=False)``: this process's rings (0: all they
        hold; ``since_ns``: only rows ending at or after it; ``packed``: rows as the rings hold them;
        each passed only when a query gives it); ``recorder_file(id, packed=False)``: where its dump
        goes (raises ValueError/OSError when it cannot); ``in_flight``: the requests
        this process knows in flight, or None where it knows none (an engine's worker)."""
        self._send = send
        self._recorder_dump = recorder_dump
        self._recorder_file = recorder_file
        self._step_thread_id = step_thread_id
        self._in_flight = in_flight
        self._running: _Running | None = None  # the one stacks sampling or recorder dump running now
        self._running_lock = threading.Lock()  # taken on the link thread, freed on the query's own

    def answer(self, query: Query) -> None:
        """Called on the link thread for each query."""
        try:
            match query.kind:
                case "requests":
                    self._send(self._inline(query, self._requests()))
                case "stacks" | "recorder" if (running := self._running) is not None:
                    log.debug("inference-sidecar: %s query refused: %s runs", query.kind, running.what)
                    self._send(Answer(query_id=query.query_id, kind=query.kind, error=running.refusal()))
                case "stacks" if query.seconds <= 0:  # on this thread: nothing else can start meanwhile
                    snap = thread_stacks.snapshot(self._step_thread_id(), skip_thread_ids=(threading.get_ident(),))
                    self._send(self._inline(query, snap))
                case "stacks":
                    self._in_thread(query, self._sample, _Running(f"a stacks sampling of {query.seconds:g} s",
                                                                  query.seconds))
                case "recorder":
                    self._in_thread(query, self._dump_recorder, _Running(f"a recorder dump of {query.seconds:g} s"))
        except Exception as exc:
            self._send(_failed(query, exc))

    def _requests(self) -> dict[str, Any]:
        if self._in_flight is None:
            return {"known": False, "requests": []}
        return {"known": True, "requests": self._in_flight()}

    def _sample(self, query: Query) -> Answer:
        only = self._step_thread_id() if query.only_step_thread else None
        sampler = thread_stacks.ThreadSampler(query.seconds, query.hz, only_thread_id=only,
                                              skip_thread_ids=(threading.get_ident(),),
                                              step_thread_id=self._step_thread_id())
        return self._inline(query, sampler.run())

    def _dump_recorder(self, query: Query) -> Answer:
        path = self._recorder_file(query.query_id, True) if query.packed else self._recorder_file(query.query_id)
        # A refresh asks for the rows since its last read (Query.since_ns): a few seconds, not the ring.
        options: dict[str, Any] = {}
        if query.since_ns:
            options["since_ns"] = query.since_ns
        if query.packed:  # the rows as they are, one msgpack encoding: no Python int made per value here
            options["packed"] = True
        dump = self._recorder_dump(query.seconds, **options)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        _remove_older_dumps(path)
        tmp = path + ".tmp"
        try:
            if query.packed:
                with open(tmp, "wb") as f:
                    f.write(msgspec.msgpack.encode(dump))
            else:
                with open(tmp, "w") as f:
                    json.dump(dump, f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return Answer(query_id=query.query_id, kind=query.kind, file=path)

    def _in_thread(self, query: Query, work: Callable[[Query], Answer], running: _Running) -> None:
        """``work`` on a thread of its own, holding the probe's one slot (module docstring) until its
        answer is ready; refused with a busy answer when the slot is held."""
        with self._running_lock:
            held = self._running
            if held is None:
                self._running = running
        if held is not None:
            self._send(Answer(query_id=query.query_id, kind=query.kind, error=held.refusal()))
            return

        def run() -> None:
            answer = None
            try:
                answer = work(query)
            except Exception as exc:
                answer = _failed(query, exc)
            finally:
                self._free(running)  # before the answer: the sidecar may ask again as soon as it has it
            self._send(answer)

        try:
            threading.Thread(target=run, name=f"inference-sidecar-{query.kind}", daemon=True).start()
        except BaseException:  # no thread (the process is out of them): nothing runs, the slot is free
            self._free(running)
            raise

    def _free(self, running: _Running) -> None:
        with self._running_lock:
            if self._running is running:
                self._running = None

    def _inline(self, query: Query, data: dict[str, Any]) -> Answer:
        size = len(json.dumps(data, separators=(",", ":")))
        if size > MAX_INLINE_BYTES:
            return Answer(query_id=query.query_id, kind=query.kind,
                          error=f"the answer is {size} bytes, over the channel's {MAX_INLINE_BYTES}")
        return Answer(query_id=query.query_id, kind=query.kind, data=data)


def _failed(query: Query, exc: Exception) -> Answer:
    log.warning("inference-sidecar: %s query failed: %s", query.kind, exc)
    return Answer(query_id=query.query_id, kind=query.kind, error=clip(f"{type(exc).__name__}: {exc}"))


def _remove_older_dumps(path: str) -> None:
    """Delete this process's earlier dumps that the sidecar never took (it timed out, or restarted):
    a dump is read once, right after it is written, so an older one is of no use to anyone."""
    folder, name = os.path.split(path)
    prefix = name[:name.rindex("-q") + 2]
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for other in names:
        if other.startswith(prefix) and other != name and other.endswith(DUMP_SUFFIXES):
            try:
                os.unlink(os.path.join(folder, other))
            except OSError:
                pass
