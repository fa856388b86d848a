"""Gathering the flight recorder of every selected process: one ``recorder`` query, each answer's dump
file read (and deleted) off the event loop. ``GET /recorder`` serves what this gathers; a trigger's
firing saves it beside its capture (triggers.py): one way to ask, so both read the same rows.

A dump holds its process's one slot for costly queries (sidecar/service/channel/query_slots.py) from the query until its file
is read. ``GET /recorder`` is refused at once when a slot is held (429); a trigger's firing cannot be
retried by anyone, so by default this waits for the slots, and asks for the seconds it waited on top:
the merged rows are still cut to the ``seconds`` before the call, so the file covers the moment the
trigger fired, not the moment the slot came free.
"""

from __future__ import annotations

import asyncio
import os
import json
import time
from pathlib import Path

import msgspec

from ...common import packed_rows
from ...common.protocol import MAX_QUERY_SECONDS, MAX_SAMPLE_SECONDS, RECORDER_DIR, recorder_dump_name
from ..channel import file_fetch
from ..export import safe_files
from . import recorder_clock
from ..channel.queries import QueryBroker
from ..channel.query_slots import Work

# A recorder dump is a file of up to a few MiB: the processes have this long to write theirs.
RECORDER_TIMEOUT_S = 10.0
MAX_DUMP_BYTES = 256 << 20  # a full step ring dumps to tens of MiB of JSON: far more is not a dump
# How long a trigger's dump waits for a busy process's slot: longer than anything holds one (a 60 s
# sampling and its 2 s to answer; a dump or a py-spy run, 10 s), so it gives up only on a process whose
# slot is taken again and again.
SLOT_WAIT_S = MAX_SAMPLE_SECONDS + 2 * RECORDER_TIMEOUT_S


async def gather_recording(queries: QueryBroker, conns: list, seconds: float, *,
                           slot_wait_s: float = SLOT_WAIT_S,
                           window_ns: tuple[int, int] | None = None) -> tuple[list, int, int]:
    """(answers as recorder_view.merge takes them: (process JSON, dump or None, error or None), since_ns,
    until_ns) of the last ``seconds`` of ``conns``.

    ``slot_wait_s``: 0 (``GET /recorder``): ``query_slots.ProbesBusy`` at once when any process has a
    stacks or recorder query in flight. More (the default, a trigger's firing): wait up to that long for
    the slots; a process still busy then is listed with a ``busy:`` error, as one that does not answer.
    ``window_ns``: (since, until) to cut the answers to instead of the last ``seconds`` (which must reach
    back to its start)."""
    asked_ns = until_ns = time.time_ns()
    since_ns = until_ns - int(seconds * 1e9)
    if window_ns is not None:  # a range (GET /recorder?start_ms=): asked back to its start, cut to it
        since_ns, until_ns = window_ns
    work = Work(f"a recorder dump of {seconds:g} s")
    if slot_wait_s <= 0:
        with queries.slots.hold(conns, work):
            got = await _ask(queries, conns, seconds)
        return [got[c.id] for c in conns], since_ns, until_ns
    async with queries.slots.hold_when_free(conns, work, slot_wait_s) as (free, busy):
        waited_s = max(0.0, (time.time_ns() - asked_ns) / 1e9)
        # 0 asks for all the rings hold; any other length is widened by the wait (merge cuts it back).
        asked_s = min(MAX_QUERY_SECONDS, seconds + waited_s) if seconds else 0.0
        got = await _ask(queries, free, asked_s) if free else {}
    for conn, holding in busy.held if busy else ():
        got[conn.id] = (conn.to_json(), None, f"busy: still running {holding.work.what} after this "
                                              f"dump waited {slot_wait_s:g} s for it")
    return [got[c.id] for c in conns], since_ns, until_ns


async def _ask(queries: QueryBroker, conns: list, seconds: float) -> dict[int, tuple]:
    """Each connection's (process JSON, dump or None, error or None), by connection id."""
    replies = await queries.ask(conns, {"kind": "recorder", "seconds": seconds, "packed": True}, RECORDER_TIMEOUT_S)
    return {reply.conn.id: await read_reply(reply) for reply in replies}


async def read_reply(reply) -> tuple:
    """A recorder query's reply as (process JSON, dump or None, error or None): its dump file read
    (and deleted) off the event loop, its times put on the sidecar's clock."""
    loop = asyncio.get_running_loop()
    dump, error = None, reply.error
    if reply.answer is not None and error is None:
        # Packed rows (Query.packed) come as .msgpack; a probe that predates them writes .json.
        packed = (reply.answer.file or "").endswith(".msgpack")
        expected = recorder_dump_name(reply.conn.identity.probe_file_stem, reply.answer.query_id, packed)
        try:
            if reply.conn.shares_files:
                dump = await loop.run_in_executor(None, read_dump, reply.answer.file, expected)
            else:  # another host: the dump comes over the channel (sidecar/service/channel/file_fetch.py)
                if os.path.basename(reply.answer.file or "") != expected:
                    raise ValueError(f"{reply.answer.file!r} is not this query's recorder dump")
                raw = await file_fetch.fetch_bytes(reply.conn, reply.answer.file, MAX_DUMP_BYTES)
                dump = await loop.run_in_executor(None, decode_dump, raw, expected)
        except (OSError, ValueError, file_fetch.FetchError) as exc:
            error = f"its recorder dump could not be read: {exc}"
    if isinstance(dump, dict):  # on the sidecar's clock where the probe's is measurably off (another host)
        dump = recorder_clock.to_sidecar_clock(dump, reply.conn.clock.correction_ns)
    return reply.conn.to_json(), dump, error


def read_dump(reported: str | None, expected_name: str) -> dict:
    """The dump a probe wrote, read and deleted. Like a capture's raw trace (sidecar/service/export/raw_files.py), only a file of
    the name this query and process give, in a ``recorder`` folder: a probe's trace root may differ
    from the sidecar's trace dir, but a report never leads the sidecar to read or delete another file."""
    if not reported:
        raise ValueError("the process named no file")
    # As reported, not resolved: a link at the dump's name (or at its folder's) is refused, not followed.
    path = os.path.normpath(reported)
    if os.path.basename(path) != expected_name or os.path.basename(os.path.dirname(path)) != RECORDER_DIR:
        raise ValueError(f"{reported!r} is not this query's recorder dump")
    folder = os.path.dirname(path)
    try:  # only that folder's own regular file (a trace root may be a shared volume)
        with safe_files.open_in_folder(Path(folder), expected_name) as f:
            return decode_dump(f.read(), expected_name)
    except safe_files.NotInFolder as exc:
        raise ValueError(f"{reported!r}: {exc}") from None
    finally:
        try:  # the name in that folder, whatever it is now: an unlink never follows a link
            os.unlink(os.path.join(folder, expected_name))
        except OSError:
            pass


def decode_dump(raw: bytes, name: str) -> dict:
    """A dump file's bytes as the JSON dump: a ``.msgpack`` one's packed rows made into columns and
    cut here, in the sidecar (sidecar/common/packed_rows.py). ValueError when it is neither."""
    if not name.endswith(".msgpack"):
        return json.loads(raw)
    try:
        decoded = msgspec.msgpack.decode(raw)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not msgpack: {exc}") from None
    return packed_rows.unpack_dump(decoded)
