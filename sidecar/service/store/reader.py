"""What the store holds, read back: the captures listed, a capture's file fetched when asked.

A sidecar on a new pod with the same ``--store`` lists the captures its predecessors stored (every
``capture.json`` under ``captures/`` and ``fleets/``, the newest ``limit`` of them, read in the
background at start) and downloads a capture's file into its local folder the first time it is
asked for (``fetch``), from then on served from the disk as any other. What the store returns is
not trusted more than a capture.json on disk: the capture's id must be the one its key names and
a capture id, its file names are checked by the same rules (jobs/capture_index.py), each download is
bounded in size and written whole or not at all.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

from ..export import disk_space
from . import client
from .counters import StoreCounters
from .layout import CAPTURES, FLEETS, capture_of

log = logging.getLogger(__name__)

LIST_LIMIT = 1000  # captures listed from the store, newest first by id (ids begin with their UTC time)
MAX_LISTED_KEYS = 200_000  # keys looked at while listing, at most: a huge bucket is not walked to its end
MAX_RECORD_BYTES = 4 << 20  # one capture.json
READ_CONCURRENCY = 8
_CHUNK = 1 << 20


class FetchFailed(Exception):
    """A stored file could not be downloaded (named: the store's reason)."""


class StoreReader:
    def __init__(self, store: Any, counters: StoreCounters) -> None:
        self._store = store
        self._counters = counters
        self._locks: dict[Path, asyncio.Lock] = {}

    async def list_captures(self, is_id: Callable[[str], bool], limit: int = LIST_LIMIT) -> list[tuple[str, dict[str, Any]]]:
        """(prefix, capture.json) of the newest ``limit`` stored captures; an unreadable one is skipped
        with a warning. Raises the store's error when the listing itself fails."""
        import obstore

        found: dict[str, str] = {}  # capture id -> prefix
        seen = 0
        for top in (CAPTURES, FLEETS):
            async for batch in obstore.list(self._store, prefix=f"{top}/", chunk_size=1000):
                for meta in batch:
                    hit = capture_of(meta["path"], is_id)
                    if hit is not None:
                        found.setdefault(*hit)
                seen += len(batch)
                if seen >= MAX_LISTED_KEYS:
                    log.warning("store: listing stopped after %d keys; older captures are not listed", seen)
                    break
        newest = sorted(found.items(), reverse=True)[:limit]
        gate = asyncio.Semaphore(READ_CONCURRENCY)

        async def read(capture_id: str, prefix: str) -> tuple[str, dict[str, Any]] | None:
            async with gate:
                try:
                    data = json.loads(await self._get_small(prefix + "capture.json"))
                except Exception as exc:
                    log.warning("store: capture %s: capture.json not read: %s", capture_id, client.describe(exc))
                    return None
            return (prefix, data) if isinstance(data, dict) and data.get("id") == capture_id else None

        records = await asyncio.gather(*(read(i, p) for i, p in newest))
        return [r for r in records if r is not None]

    async def _get_small(self, key: str) -> bytes:
        import obstore

        result = await obstore.get_async(self._store, key)
        if result.meta["size"] > MAX_RECORD_BYTES:
            raise ValueError(f"{key} is {result.meta['size']} bytes, over {MAX_RECORD_BYTES}")
        return bytes(await result.bytes_async())

    async def fetch(self, key: str, target: Path, max_bytes: int) -> None:
        """Download ``key`` to ``target`` (its folder created), whole or not at all; one download per
        target at a time (a second asker waits and finds it there). Raises FetchFailed."""
        lock = self._locks.setdefault(target, asyncio.Lock())
        try:
            async with lock:
                if target.is_file():
                    return
                await self._download(key, target, max_bytes)
        finally:
            if not lock.locked() and self._locks.get(target) is lock:
                del self._locks[target]

    async def _download(self, key: str, target: Path, max_bytes: int) -> None:
        import obstore

        loop = asyncio.get_running_loop()
        tmp = target.with_name(target.name + ".tmp")
        try:
            result = await obstore.get_async(self._store, key)
            if result.meta["size"] > max_bytes:
                raise FetchFailed(f"{key} is {result.meta['size']} bytes, over the capture size limit")
            await loop.run_in_executor(None, lambda: target.parent.mkdir(parents=True, exist_ok=True))
            fd = await loop.run_in_executor(None, lambda: os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
            written = 0
            try:
                async for chunk in result.stream(min_chunk_size=_CHUNK):
                    written += len(chunk)
                    if written > max_bytes:
                        raise FetchFailed(f"{key} is over the capture size limit")
                    await loop.run_in_executor(None, os.write, fd, bytes(chunk))
            finally:
                os.close(fd)
            await loop.run_in_executor(None, os.replace, tmp, target)
        except FetchFailed:
            disk_space.unlink_quietly(tmp)
            self._counters.fetches.labels(outcome="failed").inc()
            raise
        except Exception as exc:
            disk_space.unlink_quietly(tmp)
            self._counters.fetches.labels(outcome="failed").inc()
            raise FetchFailed(client.describe(exc)) from None
        self._counters.fetches.labels(outcome="fetched").inc()
