"""The captures the object store holds and this sidecar's disk does not: listed, served, fetched back.

A sidecar on a new pod with the same ``--store`` lists what its predecessors stored (in the
background at start, and again when ``GET /profiles`` finds the listing over ``RELIST_S`` old: never
awaited on a request), the newest ``LIST_LIMIT`` of them. Such a capture is served from its stored
capture.json; a file of it is downloaded into ``<trace-dir>/captures/<id>/`` the first time it is
asked for, its capture.json written beside it, and the capture becomes a local one again: the local
disk is the cache, and ``--keep``/``--keep-mb`` bound it as they bound this run's captures.

Retention removes the local copy only: a capture already stored stays listed from the store (unless
``--store-retention``, which removes the stored copy too).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from .capture import Capture
from .capture_index import from_json, save_capture_json
from .model import CAPTURE
from .states import FINAL
from .storing import JobStore, capture_delete, read_stored
from ..store import client
from ..store.reader import LIST_LIMIT
from ..store.uploads import STORED

log = logging.getLogger(__name__)

RELIST_S = 60.0


class StoredCaptures:
    def __init__(self, store: JobStore, trace_dir: Path, max_capture_bytes: int) -> None:
        self._store = store
        self._trace_dir = trace_dir
        self._max_bytes = max_capture_bytes
        self._remote: "OrderedDict[str, Capture]" = OrderedDict()  # oldest first, at most LIST_LIMIT
        self._listed_at: float | None = None
        self._listing = False

    def get(self, capture_id: str) -> Capture | None:
        return self._remote.get(capture_id)

    def recent(self, local: dict[str, Capture]) -> list[Capture]:
        return [c for cid, c in self._remote.items() if cid not in local]

    def relist_if_stale(self, spawn: Callable[[Any], None], local: dict[str, Capture]) -> None:
        if self._listing or (self._listed_at is not None and time.monotonic() - self._listed_at < RELIST_S):
            return
        self._listing = True
        spawn(self.relist(local))

    async def relist(self, local: dict[str, Capture]) -> None:
        """Read the store's list of captures; a store that cannot be listed is logged and tried again
        at the next ``GET /profiles`` after ``RELIST_S``."""
        self._listing = True
        try:
            records = await self._store.reader.list_captures(CAPTURE.is_id, LIST_LIMIT)
        except Exception as exc:
            log.warning("store: captures not listed: %s", client.describe(exc))
            return
        finally:
            self._listing = False
            self._listed_at = time.monotonic()
        for prefix, data in sorted(records, key=lambda r: str(r[1].get("id"))):
            if data["id"] in local or data.get("state") not in FINAL:
                continue
            try:
                capture = from_json(self._trace_dir / "captures" / data["id"], data, interrupted=False)
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                log.warning("store: capture %s: capture.json not understood (%s): not listed", data["id"], exc)
                continue
            capture.store_prefix = prefix
            capture.stored = read_stored(data.get("stored")) or {
                "url": self._store.layout.full_url(prefix), "state": STORED, "error": None}
            self._add(capture)

    def keep_listed(self, capture: Capture) -> None:
        """Retention removed ``capture`` from the local listing while its upload runs: listed from here."""
        self._add(capture)

    def forget(self, capture: Capture) -> None:
        self._remote.pop(capture.id, None)

    def _add(self, capture: Capture) -> None:
        self._remote.pop(capture.id, None)
        self._remote[capture.id] = capture
        while len(self._remote) > LIST_LIMIT:
            self._remote.popitem(last=False)

    def prefix(self, capture: Capture) -> str | None:
        """Where ``capture`` is in the store, when it is stored there (its ``stored.url`` under this store)."""
        stored = capture.stored or {}
        if stored.get("state") != STORED:
            return None
        if capture.store_prefix is None:
            base = self._store.layout.url + "/"
            url = str(stored.get("url") or "")
            capture.store_prefix = url[len(base):] if url.startswith(base) and url.endswith("/") else None
        return capture.store_prefix

    def retained_locally(self, capture: Capture) -> None:
        """Retention removed ``capture``'s local copy: listed from the store from now on, or, with
        store retention, removed from there too."""
        if self.prefix(capture) is None:
            return
        if self._store.retention:
            self._store.uploader.submit(capture_delete(self._store, capture))
        else:
            self._add(capture)

    async def ensure_local(self, capture: Capture, name: str, adopt: Callable[[Capture], None]) -> None:
        """Download ``name`` of a stored capture when the local disk lacks it (raises reader.FetchFailed);
        a capture that was only in the store becomes local (``adopt``), with its capture.json."""
        prefix = self.prefix(capture)
        if prefix is None or (capture.dir / name).exists():
            return
        await self._store.reader.fetch(prefix + name, capture.dir / name, self._max_bytes)
        if self._remote.pop(capture.id, None) is not None:
            save_capture_json(capture)
            adopt(capture)
