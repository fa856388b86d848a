"""Uploads to the object store in the background: a bounded queue, one worker, retries with backoff.

Nothing here runs on the request path or the engine's: a finished job is handed over with
``submit`` (a deque append, never a wait), and the worker uploads from the local files, which stay
the cache. Each upload carries its job's ``stored`` object (``{url, state, error}``, in the job's
JSON) and updates it in place, then asks its owner to save the job again (``on_change``).

- ``pending`` → ``uploading`` → ``stored``; an attempt that fails on something a retry can mend (the
  store unreachable, a time-out, a 5xx) makes it ``retrying``, with the error, and it is tried again
  after a backoff that doubles up to ``backoff_s[1]``, for ``retry_for_s`` at most, then ``failed``.
  The files already stored are not sent again. While one upload waits to be retried, the ones behind
  it wait too: their order is kept, and a store that is down is not hammered by every upload at once.
- A refusal a retry cannot mend (bad credentials, no such bucket: client.py ``permanent``) fails the
  upload at once with the store's reason; it is logged once per kind of refusal, not per upload.
- A full queue (``max_pending`` waiting) drops its oldest waiting upload, ``dropped`` and counted,
  never the newest: the newest capture is the one being asked about.

Memory is bounded by ``max_pending`` uploads of a few paths each; the files are streamed by the
library (multipart for large ones), never read whole here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import client
from .counters import StoreCounters

log = logging.getLogger(__name__)

PENDING, UPLOADING, RETRYING, STORED, FAILED, DROPPED = "pending", "uploading", "retrying", "stored", "failed", "dropped"
ENDED = (STORED, FAILED, DROPPED)
MAX_PENDING = 64
RETRY_FOR_S = 3600.0
BACKOFF_S = (0.5, 30.0)


def new_status(url: str) -> dict[str, Any]:
    """A job's ``stored`` object as it enters the queue."""
    return {"url": url, "state": PENDING, "error": None}


class LocalFileGone(Exception):
    """A file to upload was removed from the local disk first (retention, an operator)."""


@dataclass(eq=False)
class Upload:
    kind: str  # capture, scan, modules, recorder (counters.KINDS)
    name: str  # for the log: "capture 20260101-..."
    status: dict[str, Any]  # the job's ``stored``, updated in place
    files: list[tuple[str, Path]] = field(default_factory=list)  # (key, local file): uploaded first
    # (key, its bytes made when sent): uploaded last, the record that says the rest is complete.
    document: tuple[str, Callable[[], bytes]] | None = None
    deletes: list[str] = field(default_factory=list)  # key prefixes removed from the store (store retention)
    on_change: Callable[[], None] | None = None
    done: set[str] = field(default_factory=set)  # keys already stored: not sent again on a retry


class Uploader:
    def __init__(self, store: Any, counters: StoreCounters, *, max_pending: int = MAX_PENDING,
                 retry_for_s: float = RETRY_FOR_S, backoff_s: tuple[float, float] = BACKOFF_S) -> None:
        self._store = store
        self._counters = counters
        self._max_pending = max(1, max_pending)
        self._retry_for_s = retry_for_s
        self._backoff_s = backoff_s
        self._pending: deque[Upload] = deque()
        self._current: Upload | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._refusals_named: set[str] = set()

    @property
    def pending(self) -> int:
        return len(self._pending) + (self._current is not None)

    def submit(self, upload: Upload) -> None:
        """Queue ``upload`` (never waits); when ``max_pending`` wait already, the oldest waiting is dropped."""
        if len(self._pending) >= self._max_pending:
            oldest = self._pending.popleft()
            log.warning("store: %s not uploaded: the upload queue was full (%d waiting)", oldest.name, self._max_pending)
            self._end(oldest, DROPPED, f"dropped: the upload queue was full ({self._max_pending} waiting); "
                                       f"the local copy is kept")
        upload.status.update(state=PENDING, error=None)
        self._pending.append(upload)
        self._counters.pending.set(self.pending)
        self._wake.set()
        if self._task is None:
            try:
                self._task = asyncio.get_running_loop().create_task(self._work())
            except RuntimeError:  # no loop yet (restored at construction): started by start()
                pass

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._work())

    async def close(self) -> None:
        """Stop the worker. What is still queued stays ``pending`` in its saved JSON: the next start
        of the sidecar queues it again."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _work(self) -> None:
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            upload = self._current = self._pending.popleft()
            try:
                await self._run(upload)
            except asyncio.CancelledError:
                upload.status.update(state=PENDING)
                raise
            except Exception as exc:  # a bug here must not stop every later upload
                log.exception("store: %s: upload failed", upload.name)
                self._end(upload, FAILED, client.describe(exc))
            finally:
                self._current = None
                self._counters.pending.set(self.pending)

    async def _run(self, upload: Upload) -> None:
        began, delay = time.monotonic(), self._backoff_s[0]
        attempts = 0
        while True:
            attempts += 1
            self._set(upload, UPLOADING if attempts == 1 else RETRYING, upload.status.get("error"))
            try:
                await self._attempt(upload)
            except LocalFileGone as exc:
                self._end(upload, FAILED, f"not uploaded: {exc}")
                return
            except Exception as exc:
                why = client.describe(exc)
                if client.permanent(exc):
                    self._name_refusal(upload, exc, why)
                    self._end(upload, FAILED, why)
                    return
                if time.monotonic() - began + delay > self._retry_for_s:
                    log.warning("store: %s: gave up after %d attempts: %s", upload.name, attempts, why)
                    self._end(upload, FAILED, f"gave up after {attempts} attempts in "
                                              f"{time.monotonic() - began:.0f} s: {why}")
                    return
                if attempts == 1:
                    log.warning("store: %s: upload failed, retrying with backoff: %s", upload.name, why)
                self._counters.retries.inc()
                self._set(upload, RETRYING, why)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._backoff_s[1])
                continue
            self._end(upload, STORED, None)
            return

    async def _attempt(self, upload: Upload) -> None:
        import obstore

        for key, path in upload.files:
            if key in upload.done:
                continue
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise LocalFileGone(f"{path.name} was removed from the local disk before it was uploaded") from None
            await obstore.put_async(self._store, key, path)
            upload.done.add(key)
            self._counters.bytes.inc(size)
        for prefix in upload.deletes:
            keys = [meta["path"] async for batch in obstore.list(self._store, prefix=prefix) for meta in batch]
            if keys:
                await obstore.delete_async(self._store, keys)
        if upload.document is not None:
            key, make = upload.document
            data = make()
            await obstore.put_async(self._store, key, data)
            self._counters.bytes.inc(len(data))

    def _name_refusal(self, upload: Upload, exc: BaseException, why: str) -> None:
        kind = type(exc).__name__
        if kind not in self._refusals_named:
            self._refusals_named.add(kind)
            log.error("store: %s refused, not retried: %s (later refusals of this kind are not logged again)",
                      upload.name, why)

    def _set(self, upload: Upload, state: str, error: str | None) -> None:
        if upload.status.get("state") == state and upload.status.get("error") == error:
            return
        upload.status.update(state=state, error=error)
        self._changed(upload)

    def _end(self, upload: Upload, state: str, error: str | None) -> None:
        upload.status.update(state=state, error=error)
        self._counters.uploads.labels(kind=upload.kind, outcome=state).inc()
        self._changed(upload)

    @staticmethod
    def _changed(upload: Upload) -> None:
        if upload.on_change is not None:
            try:
                upload.on_change()
            except Exception:  # saving the job's JSON again: its own errors are logged where it saves
                log.exception("store: %s: saving its state failed", upload.name)
