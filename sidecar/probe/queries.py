"""A probe's answers to the sidecar's queries: the flight recorder, Python stacks, requests in flight.

Every query is answered off the step thread: a snapshot of stacks and the requests in flight on the
link thread (a few ms), a stacks sampling and a recorder dump on a short-lived thread of their own
(so the link keeps its heartbeats, and the export thread, which may be writing a capture, is not
waited for). That is what lets a process whose step thread is stuck inside a forward still answer.

A recorder dump can be larger than a channel frame, so it is written as JSON to
``<trace root>/recorder/<stem>-q<id>.json`` (trace_root.py) and the answer names that file; the
sidecar reads it and deletes it. One the sidecar never took (it timed out, or restarted) is deleted
by the process's next dump. Stacks and requests travel inline.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any, Callable

from ..protocol import Answer, Query
from ..step_window import clip
from .. import thread_stacks

log = logging.getLogger(__name__)

# An inline answer's data is held under this many bytes of JSON: the sidecar's frame limit is 1 MiB.
MAX_INLINE_BYTES = 900_000


class QueryAnswerer:
    def __init__(self, *, send: Callable[[Answer], None], recorder_dump: Callable[[float], dict],
                 recorder_file: Callable[[int], str], step_thread_id: Callable[[], int | None],
                 in_flight: Callable[[], list[dict]] | None) -> None:
        """``recorder_dump(seconds)``: this process's rings (0: all they hold); ``recorder_file(id)``:
        where its dump goes (raises ValueError/OSError when it cannot); ``in_flight``: the requests
        this process knows in flight, or None where it knows none (an engine's worker)."""
        self._send = send
        self._recorder_dump = recorder_dump
        self._recorder_file = recorder_file
        self._step_thread_id = step_thread_id
        self._in_flight = in_flight

    def answer(self, query: Query) -> None:
        """Called on the link thread for each query."""
        try:
            match query.kind:
                case "requests":
                    self._reply(query, data=self._requests())
                case "stacks" if query.seconds <= 0:
                    snap = thread_stacks.snapshot(self._step_thread_id(), skip_thread_ids=(threading.get_ident(),))
                    self._reply(query, data=snap)
                case "stacks":
                    self._in_thread(query, self._sample)
                case "recorder":
                    self._in_thread(query, self._dump_recorder)
        except Exception as exc:
            log.warning("inference-sidecar: %s query failed: %s", query.kind, exc)
            self._send(Answer(query_id=query.query_id, kind=query.kind, error=clip(f"{type(exc).__name__}: {exc}")))

    def _requests(self) -> dict[str, Any]:
        if self._in_flight is None:
            return {"known": False, "requests": []}
        return {"known": True, "requests": self._in_flight()}

    def _sample(self, query: Query) -> None:
        only = self._step_thread_id() if query.only_step_thread else None
        sampler = thread_stacks.ThreadSampler(query.seconds, query.hz, only_thread_id=only,
                                              skip_thread_ids=(threading.get_ident(),),
                                              step_thread_id=self._step_thread_id())
        self._reply(query, data=sampler.run())

    def _dump_recorder(self, query: Query) -> None:
        path = self._recorder_file(query.query_id)
        dump = self._recorder_dump(query.seconds)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        _remove_older_dumps(path)
        tmp = path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(dump, f, separators=(",", ":"))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self._send(Answer(query_id=query.query_id, kind=query.kind, file=path))

    def _in_thread(self, query: Query, work: Callable[[Query], None]) -> None:
        def run() -> None:
            try:
                work(query)
            except Exception as exc:
                log.warning("inference-sidecar: %s query failed: %s", query.kind, exc)
                self._send(Answer(query_id=query.query_id, kind=query.kind, error=clip(f"{type(exc).__name__}: {exc}")))

        threading.Thread(target=run, name=f"inference-sidecar-{query.kind}", daemon=True).start()

    def _reply(self, query: Query, data: dict[str, Any]) -> None:
        size = len(json.dumps(data, separators=(",", ":")))
        if size > MAX_INLINE_BYTES:
            self._send(Answer(query_id=query.query_id, kind=query.kind,
                              error=f"the answer is {size} bytes, over the channel's {MAX_INLINE_BYTES}"))
            return
        self._send(Answer(query_id=query.query_id, kind=query.kind, data=data))


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
        if other.startswith(prefix) and other != name and other.endswith((".json", ".json.tmp")):
            try:
                os.unlink(os.path.join(folder, other))
            except OSError:
                pass
