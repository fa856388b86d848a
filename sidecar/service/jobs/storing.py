"""A finished job handed to the object store (sidecar/service/store/): what is uploaded of each kind,
under which key, and the job's ``stored`` object (``{url, state, error}``) that follows the upload.

``JobStore`` is what a job manager holds when ``sidecar serve --store`` is set (None otherwise):
the uploader, the reader and the layout. A capture uploads its files first (merged trace,
per-process traces, summary) and its capture.json last, with ``stored.state`` ``stored`` in the
copy sent: a capture.json in the store says the capture's files are there. A scan and a module timing
upload their one JSON file; a trigger's recorder dump its gzip file. Each change of state saves the
job's JSON on disk again, so that a restart on the same disk queues what was not stored yet.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..store.layout import CAPTURE_JSON, StoreLayout
from ..store.reader import StoreReader
from ..store.uploads import ENDED, STORED, Upload, Uploader, new_status

STORED_STATES = ("pending", "uploading", "retrying", *ENDED)


@dataclass(frozen=True)
class JobStore:
    uploader: Uploader
    reader: StoreReader
    layout: StoreLayout
    retention: bool = False  # --keep and --keep-mb remove the store's copies too (--store-retention)


def read_stored(value: Any) -> dict[str, Any] | None:
    """A saved ``stored`` object, checked (a capture.json is not trusted): None if not one."""
    if not isinstance(value, dict) or value.get("state") not in STORED_STATES or not isinstance(value.get("url"), str):
        return None
    error = value.get("error")
    return {"url": value["url"], "state": value["state"], "error": str(error) if error is not None else None}


def waiting(stored: dict[str, Any] | None) -> bool:
    """Whether a restored job's upload had not ended when the sidecar stopped: queued again."""
    return stored is not None and stored.get("state") not in ENDED


def capture_upload(store: JobStore, capture: Any, save: Callable[[Any], None]) -> Upload:
    """The upload of a finished capture's files and capture.json; ``capture.stored`` set pending."""
    prefix = capture.store_prefix or store.layout.capture_prefix(capture.id, capture.request.fleet)
    capture.store_prefix = prefix
    capture.stored = new_status(store.layout.full_url(prefix))
    names = list(dict.fromkeys([*capture.files(), *([capture.summary_file] if capture.summary_file else [])]))

    def record() -> bytes:
        data = capture.to_json()
        data["stored"] = {**capture.stored, "state": STORED, "error": None}
        return json.dumps(data, indent=1).encode()

    return Upload(kind="capture", name=f"capture {capture.id}", status=capture.stored,
                  files=[(prefix + name, capture.dir / name) for name in names],
                  document=(prefix + CAPTURE_JSON, record), on_change=lambda: save(capture))


def capture_delete(store: JobStore, capture: Any) -> Upload:
    """Store retention (``JobStore.retention``): the capture's stored copy removed."""
    return Upload(kind="capture", name=f"capture {capture.id} (removal)", status=dict(capture.stored or {}),
                  deletes=[capture.store_prefix])


def result_upload(store: JobStore, kind: str, folder: str, job: Any, save: Callable[[Any], None]) -> Upload:
    """The upload of a job whose result is one JSON file (a scan, a module timing)."""
    key = f"{folder}/{job.id}.json"
    job.stored = new_status(store.layout.full_url(key))

    def document() -> bytes:
        data = job.to_json()
        data["stored"] = {**job.stored, "state": STORED, "error": None}
        return json.dumps(data, indent=1).encode()

    return Upload(kind=kind, name=f"{kind} {job.id}", status=job.stored, document=(key, document),
                  on_change=lambda: save(job))


def recorder_upload(store: JobStore, path: Path) -> Upload:
    """A trigger's flight-recorder dump (no job of its own: its state is in the counters and the log)."""
    key = store.layout.recorder_key(path.name)
    return Upload(kind="recorder", name=f"recorder dump {path.name}", status=new_status(store.layout.full_url(key)),
                  files=[(key, path)])
