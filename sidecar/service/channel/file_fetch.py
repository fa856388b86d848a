"""Fetching a probe's files over the probe channel, where the sidecar cannot read its disk (issue 14).

A probe whose marker file the sidecar does not see (``hello.marker``: another host, another
container without a shared volume, or ``SIDECAR_PROBE_SEND_FILES=1``) names its files as always, and
the sidecar asks for them chunk by chunk (``fetch`` → ``file_chunk``, sidecar/probe/file_sender.py).
One chunk in flight per file: the sidecar's own pace is the back-pressure, the probe never queues.
The bytes are checked against the size and the SHA-256 the probe gives with the last chunk. A probe
that goes away mid-transfer fails its fetches at once (``fail_all``); one that stops answering fails
after ``CHUNK_TIMEOUT_S``: the caller reports that process's file missing.

The probe's word on the size is held to as the bytes arrive (issue 27): the first chunk's ``size``
must be within the limit and stay the same, and a chunk that would take the bytes received past
it (or past the limit) fails the fetch before it is kept. So nothing is written beyond the
smaller of the declared size and the limit, memory holds one chunk, and the partial file is deleted.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
from pathlib import Path
from typing import Any

from ...common.protocol import Fetch, FileChunk
from ..export import disk_space

CHUNK_TIMEOUT_S = 30.0


class FetchError(Exception):
    pass


def on_chunk(conn: Any, chunk: FileChunk) -> None:
    """A ``file_chunk`` from ``conn``: to the fetch waiting for it (one not asked for is dropped)."""
    waiter = conn.chunk_waiters.pop((chunk.file, chunk.offset), None)
    if waiter is not None and not waiter.done():
        waiter.set_result(chunk)


def fail_all(conn: Any, reason: str) -> None:
    """``conn`` is gone: every fetch waiting on it fails now."""
    for waiter in conn.chunk_waiters.values():
        if not waiter.done():
            waiter.set_exception(FetchError(reason))
    conn.chunk_waiters.clear()


async def _chunks(conn: Any, remote: str, max_bytes: int, timeout_s: float):
    """The file's chunks in order, checked; raises FetchError."""
    offset, digest, size = 0, hashlib.sha256(), None
    loop = asyncio.get_running_loop()
    while True:
        waiter = loop.create_future()
        conn.chunk_waiters[(remote, offset)] = waiter
        if not await conn.send(Fetch(file=remote, offset=offset)):
            conn.chunk_waiters.pop((remote, offset), None)
            raise FetchError("the process is unreachable")
        try:
            chunk: FileChunk = await asyncio.wait_for(waiter, timeout_s)
        except asyncio.TimeoutError:
            conn.chunk_waiters.pop((remote, offset), None)
            raise FetchError(f"no answer within {timeout_s:g} s at byte {offset}") from None
        if chunk.error:
            raise FetchError(chunk.error)
        if size is None and chunk.size > max_bytes:
            raise FetchError(f"{chunk.size} bytes: over the limit of {_mib(max_bytes)}")
        if size is not None and chunk.size != size:
            raise FetchError(f"the declared size changed from {size} to {chunk.size} bytes at byte {offset}")
        size = chunk.size
        data = base64.b64decode(chunk.data, validate=True)
        if offset + len(data) > size:
            raise FetchError(f"more bytes than the {size} declared: cut off at byte {offset}")
        if offset + len(data) > max_bytes:  # the declared size is within it: this only guards that rule
            raise FetchError(f"over the limit of {_mib(max_bytes)}: cut off at byte {offset}")
        digest.update(data)
        offset += len(data)
        yield data
        if chunk.sha256 is not None or not data:
            if offset != size:
                raise FetchError(f"received {offset} bytes of {size}")
            if chunk.sha256 != digest.hexdigest():
                raise FetchError("checksum mismatch: the file changed or was damaged on the way")
            return


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


async def fetch_file(conn: Any, remote: str, target: Path, max_bytes: int,
                     timeout_s: float = CHUNK_TIMEOUT_S) -> int:
    """Fetch ``remote`` from ``conn`` into ``target`` (created, replaced); its size. Raises FetchError
    (and leaves no partial file)."""
    loop = asyncio.get_running_loop()
    target.parent.mkdir(parents=True, exist_ok=True)
    total = 0
    try:
        with open(target, "wb") as out:
            async for data in _chunks(conn, remote, max_bytes, timeout_s):
                await loop.run_in_executor(None, out.write, data)  # a disk may be slow: not on the loop
                total += len(data)
    except (FetchError, OSError, ValueError) as exc:
        disk_space.unlink_quietly(target)
        if isinstance(exc, OSError):
            raise FetchError(f"cannot write {target.name}: {disk_space.describe(exc)}") from None
        raise FetchError(str(exc)) from None
    except BaseException:  # cancelled (the sidecar stops): no partial file either
        disk_space.unlink_quietly(target)
        raise
    return total


async def fetch_bytes(conn: Any, remote: str, max_bytes: int, timeout_s: float = CHUNK_TIMEOUT_S) -> bytes:
    """Fetch ``remote`` into memory (a recorder dump: a few MiB). Raises FetchError."""
    try:
        return b"".join([data async for data in _chunks(conn, remote, max_bytes, timeout_s)])
    except ValueError as exc:  # bad base64
        raise FetchError(str(exc)) from None


def shares_files(files_at: str, marker: str, markers_dir: str) -> bool:
    """The sidecar sees the probe's marker file: they share a file system, and the sidecar reads the
    files the probe names where they lie. Asked only after the probe proved the token."""
    if not marker or not os.path.isabs(files_at):
        return False
    return os.path.isfile(os.path.join(files_at, markers_dir, marker))
