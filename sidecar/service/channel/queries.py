"""Questions the sidecar asks every connected probe at once, and their answers gathered by id.

``QueryBroker.ask`` sends one ``Query`` to each chosen probe and waits, with one deadline for all,
for their ``Answer`` frames (sidecar/service/routes/probe_channel.py hands each to ``on_answer``). A probe that does not
answer in time, that leaves, or that cannot be sent to is reported with the reason, never waited
for past the deadline: a stuck engine process must not make ``/stacks`` hang. Ids are the broker's
own counter, so an answer to an older, timed-out query is recognised and dropped.

The broker also owns each probe's one slot for costly queries (``slots``, query_slots.py): the
callers of a stacks or recorder query take it around ``ask``; the broker frees a lost probe's.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...common.protocol import Answer, Query
from .query_slots import QuerySlots

if TYPE_CHECKING:
    from .registry import ProbeConnection

log = logging.getLogger(__name__)


@dataclass
class Reply:
    conn: "ProbeConnection"
    answer: Answer | None  # None: no answer; ``error`` says why
    error: str | None = None


class QueryBroker:
    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._pending: dict[tuple[int, int], asyncio.Future] = {}  # (query id, connection id) -> answer
        self.slots = QuerySlots()  # one stacks or recorder query in flight per probe

    async def ask(self, conns: list["ProbeConnection"], query_fields: dict, timeout_s: float) -> list[Reply]:
        """``query_fields``: the ``Query``'s fields but its id. One reply per connection, in order."""
        query = Query(query_id=next(self._ids), **query_fields)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future | None] = []
        for conn in conns:
            future = loop.create_future()
            self._pending[(query.query_id, conn.id)] = future
            futures.append(future if await conn.send(query) else None)
        deadline = time.monotonic() + timeout_s
        replies = []
        try:
            for conn, future in zip(conns, futures):
                if future is None:
                    replies.append(Reply(conn, None, "the process could not be reached"))
                    continue
                try:
                    answer = await asyncio.wait_for(asyncio.shield(future), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    replies.append(Reply(conn, None, f"no answer within {timeout_s:g} s"))
                    continue
                if answer is None:
                    replies.append(Reply(conn, None, "the process disconnected before answering"))
                else:
                    replies.append(Reply(conn, answer, answer.error))
        finally:
            for conn in conns:
                self._pending.pop((query.query_id, conn.id), None)
        return replies

    def on_answer(self, conn: "ProbeConnection", answer: Answer) -> None:
        future = self._pending.get((answer.query_id, conn.id))
        if future is None or future.done():
            log.debug("probe %s: answer to query %d dropped (late or unknown)", conn.identity.label, answer.query_id)
            return
        future.set_result(answer)

    def on_probe_lost(self, conn: "ProbeConnection") -> None:
        self.slots.free(conn)
        for (_, conn_id), future in list(self._pending.items()):
            if conn_id == conn.id and not future.done():
                future.set_result(None)
