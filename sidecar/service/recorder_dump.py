"""Gathering the flight recorder of every selected process: one ``recorder`` query, each answer's dump
file read (and deleted) off the event loop. ``GET /recorder`` serves what this gathers; a trigger's
firing saves it beside its capture (triggers.py): one way to ask, so both read the same rows."""

from __future__ import annotations

import asyncio
import os
import json
import time

from ..protocol import RECORDER_DIR
from . import file_fetch, recorder_clock
from .queries import QueryBroker

# A recorder dump is a file of up to a few MiB: the processes have this long to write theirs.
RECORDER_TIMEOUT_S = 10.0
MAX_DUMP_BYTES = 256 << 20  # a full step ring dumps to tens of MiB of JSON: far more is not a dump


async def gather_recording(queries: QueryBroker, conns: list, seconds: float) -> tuple[list, int, int]:
    """(answers as recorder_view.merge takes them: (process JSON, dump or None, error or None), since_ns,
    until_ns) of the last ``seconds`` of ``conns``."""
    until_ns = time.time_ns()
    replies = await queries.ask(conns, {"kind": "recorder", "seconds": seconds}, RECORDER_TIMEOUT_S)
    loop = asyncio.get_running_loop()
    answers = []
    for reply in replies:
        dump, error = None, reply.error
        if reply.answer is not None and error is None:
            expected = f"{reply.conn.identity.probe_file_stem}-q{reply.answer.query_id}.json"
            try:
                if reply.conn.shares_files:
                    dump = await loop.run_in_executor(None, read_dump, reply.answer.file, expected)
                else:  # another host: the dump comes over the channel (file_fetch.py)
                    if os.path.basename(reply.answer.file or "") != expected:
                        raise ValueError(f"{reply.answer.file!r} is not this query's recorder dump")
                    dump = json.loads(await file_fetch.fetch_bytes(reply.conn, reply.answer.file, MAX_DUMP_BYTES))
            except (OSError, ValueError, file_fetch.FetchError) as exc:
                error = f"its recorder dump could not be read: {exc}"
        if isinstance(dump, dict):  # on the sidecar's clock where the probe's is measurably off (another host)
            dump = recorder_clock.to_sidecar_clock(dump, reply.conn.clock.correction_ns)
        answers.append((reply.conn.to_json(), dump, error))
    return answers, until_ns - int(seconds * 1e9), until_ns


def read_dump(reported: str | None, expected_name: str) -> dict:
    """The dump a probe wrote, read and deleted. Like a capture's raw trace (raw_files.py), only a file of
    the name this query and process give, in a ``recorder`` folder: a probe's trace root may differ
    from the sidecar's trace dir, but a report never leads the sidecar to read or delete another file."""
    if not reported:
        raise ValueError("the process named no file")
    path = os.path.realpath(reported)
    if os.path.basename(path) != expected_name or os.path.basename(os.path.dirname(path)) != RECORDER_DIR:
        raise ValueError(f"{reported!r} is not this query's recorder dump")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
