"""What a job saved on disk gives back after a sidecar restart: the pieces every kind rebuilds
(when it was created, its JSON read safely; its processes come back by model.py's
``ProcessRun.from_json``). The disk is the truth: a restarted sidecar lists, serves and retains the
jobs an earlier run left (capture_index.py, scans.py).
"""

from __future__ import annotations

import calendar
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, ClassVar

from ..export import disk_space, safe_files
from .states import FINAL
from .storing import JobStore, result_upload
from ..store.uploads import Upload
from .model import Job, JobKind

log = logging.getLogger(__name__)


def read_saved(path: Path) -> dict[str, Any] | None:
    """A saved job's JSON object; None when missing, empty (a full disk) or corrupt (a crash), or not
    a regular file: a symbolic link planted in its place is not followed (sidecar/service/export/safe_files.py)."""
    try:
        with safe_files.open_regular_file(path) as file:
            data = json.loads(file.read().decode("utf-8"))
    except (OSError, ValueError, safe_files.NotInFolder):
        return None
    return data if isinstance(data, dict) else None


def id_time(kind: JobKind, job_id: str) -> float | None:
    """When the job was created, from its id (``YYYYmmdd-HHMMSS`` UTC after the kind's prefix)."""
    stamp = job_id[len(kind.id_prefix):len(kind.id_prefix) + 15]
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y%m%d-%H%M%S")))
    except ValueError:
        return None


class SavedAsOneFile:
    """The disk side of a job kind whose whole result is one JSON file, ``<folder>/<id>.json``
    (sync scans, module timings): saved atomically (a half-written file is no result), read back at
    start (a leftover ``.tmp`` or an unreadable file deleted), removed and sized for retention.
    Mixed into a ``JobManager`` subclass, which sets ``_dir`` and ``kind``; ``saved_noun`` names the
    kind in log lines and ``job_from_json`` rebuilds one finished job."""

    _dir: Path
    kind: ClassVar[JobKind]
    saved_noun: ClassVar[str]
    job_from_json: ClassVar[Callable[[dict[str, Any]], Job]]
    store_kind: ClassVar[str]  # its uploads' ``kind`` label (store/counters.py) and its folder in the store
    store_folder: ClassVar[str]
    _store: "JobStore | None"

    def _upload(self, job: Job) -> "Upload":
        return result_upload(self._store, self.store_kind, self.store_folder, job, self._save)

    def _path(self, job_id: str) -> Path:
        return self._dir / f"{job_id}.json"

    def _save(self, job: Job) -> None:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            disk_space.write_atomic(self._path(job.id), json.dumps(job.to_json(), indent=1))
        except OSError as exc:
            log.warning("%s %s: cannot save: %s", self.saved_noun, job.id, disk_space.describe(exc))

    def _restore(self) -> list[Job]:
        """The finished jobs an earlier run saved (the disk is the truth: listed and retained again)."""
        try:
            entries = list(self._dir.iterdir())
        except OSError:
            return []
        restored = []
        for path in entries:
            if path.name.endswith(".json.tmp") and self.kind.is_id(path.name[:-len(".json.tmp")]):
                disk_space.unlink_quietly(path)  # a save a crash or a full disk cut short
                continue
            if path.suffix != ".json" or not self.kind.is_id(path.stem):
                continue
            data = read_saved(path)
            try:
                if data is None or data.get("id") != path.stem or data.get("state") not in FINAL:
                    raise ValueError(f"not a finished {self.saved_noun}'s result")
                restored.append(type(self).job_from_json(data))
            except (TypeError, ValueError, KeyError) as exc:
                log.warning("%s %s: %s is unreadable (%s): deleted", self.saved_noun, path.stem, path, exc)
                disk_space.unlink_quietly(path)
        return restored

    def _remove(self, job: Job) -> None:
        self._path(job.id).unlink(missing_ok=True)

    def _footprint(self, job: Job) -> int:
        try:
            return self._path(job.id).stat().st_size
        except OSError:
            return 0
