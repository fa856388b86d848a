"""The captures an earlier run of the sidecar left in ``<trace-dir>/captures/``, rebuilt at start.

Each finished capture's folder holds its ``capture.json`` (``GET /profile/{id}``'s object): read
back, it becomes a ``Capture`` again, so a restarted sidecar lists it, serves its files and counts it
for retention. A folder without a readable, final ``capture.json`` is a capture the sidecar was
killed in (or a disk that filled while it was saved): it is ``failed`` with ``INTERRUPTED``, its
leftovers (the raw folder with its traces and stack samples, partial gzip, temporary files) are
deleted and its capture.json rewritten.

A restored capture.json is not trusted (docs/security.md, "The trace dir"): a folder under a capture's
name that is a symbolic link is ignored, and a file it names is kept only if it is a name the sidecar
writes and, where it exists, a regular file of the folder (sidecar/service/export/safe_files.py). A bad one is dropped with
a warning in the log and a note in the capture: the rest of the capture is still listed, served and
counted for retention (hiding it would leave its folder on disk for ever, outside ``--keep``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from ...common.protocol import DEFAULT_STACK_HZ, P_DONE, P_FAILED
from ..export import disk_space, safe_files
from .capture import Capture, CaptureProcess
from .states import FAILED, FINAL, P_LOST, P_TERMINAL
from .model import CAPTURE
from ..export.merge import MERGED_NAME, RAW_DIR, SUMMARY_NAME
from .params import CaptureRequest, ProcessSelector
from .saved import id_time, read_saved
from .storing import read_stored
from ..store.layout import FLEET_ID

log = logging.getLogger(__name__)

CAPTURE_JSON = "capture.json"
INTERRUPTED = "interrupted: the sidecar stopped during the capture"
_PROCESS_INTERRUPTED = "the sidecar stopped during the capture"


def restore_captures(trace_dir: Path) -> list[Capture]:
    """Every capture on disk under ``trace_dir``, oldest first; interrupted ones marked and cleaned."""
    root = trace_dir / "captures"
    try:
        folders = [f for f in root.iterdir() if CAPTURE.is_id(f.name) and _own_folder(f)]
    except OSError:
        return []
    restored = []
    for folder in folders:
        data = read_saved(folder / CAPTURE_JSON)
        final = data is not None and data.get("state") in FINAL and data.get("id") == folder.name
        try:
            capture = from_json(folder, data if final else data or {}, interrupted=not final)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:  # a capture.json of another version, say
            log.warning("capture %s: capture.json not understood (%s): marked interrupted", folder.name, exc)
            capture, final = from_json(folder, {}, interrupted=True), False
        _clear_leftovers(folder, keep_all=final)
        if not final:
            save_capture_json(capture, again=True)
        restored.append(capture)
    return sorted(restored, key=lambda c: (c.created_at, c.id))


def save_capture_json(capture: Capture, *, again: bool = False) -> None:
    """Write ``capture.to_json()`` as its capture.json, whole or not at all: a half-written one would
    be read back as an interrupted capture. ``again``: the rewrite of a restored one."""
    try:
        disk_space.write_atomic(capture.dir / CAPTURE_JSON, json.dumps(capture.to_json(), indent=1))
    except OSError as exc:
        log.warning("capture %s: cannot %s capture.json: %s", capture.id, "rewrite" if again else "write",
                    disk_space.describe(exc))


def from_json(folder: Path, data: dict[str, Any], *, interrupted: bool) -> Capture:
    options = data.get("options") or {}
    capture = Capture(
        id=folder.name, dir=folder, request=_request(data, options),
        processes=[_process(p, interrupted) for p in data.get("processes") or []],
        state=FAILED if interrupted else data["state"],
        reason=INTERRUPTED if interrupted else data.get("reason"),
        notes=list(data.get("notes") or []), start_step=data.get("start_step"),
        start_steps={str(k): int(v) for k, v in (data.get("start_steps") or {}).items() if isinstance(v, int)},
        created_at=float(data.get("created_at") or id_time(CAPTURE, folder.name) or _mtime(folder)),
        finished_at=_mtime(folder) if interrupted else data.get("finished_at"),
        trigger=data.get("trigger") if isinstance(data.get("trigger"), dict) else None,
        alert=data.get("alert") if isinstance(data.get("alert"), dict) else None,
        bound_request=data.get("request") if isinstance(data.get("request"), dict) else None,
        stored=read_stored(data.get("stored")),
    )
    if not interrupted:
        capture.trace_file = MERGED_NAME if data.get("trace") else None
        capture.trace_bytes = int(data.get("trace_bytes") or 0)
        capture.summary_file = SUMMARY_NAME if data.get("summary") else None
        capture.headline = data.get("headline")
        _keep_own_files(capture)
    capture.done_event.set()
    return capture


def _own_folder(entry: Path) -> bool:
    """A folder the sidecar made: a symbolic link under a capture's name is not one (its target's
    files would be served, an interrupted one's deleted)."""
    if entry.is_symlink():
        log.warning("capture %s: %s is a symbolic link, not a folder the sidecar made: ignored", entry.name, entry)
        return False
    return entry.is_dir()


def _keep_own_files(capture: Capture) -> None:
    """Drop every file the restored capture.json names that the sidecar would not serve: a process's
    ``file`` that is not a name the export writes (a path, ``..``, any other name), and any file that
    is on disk as something else than a regular file of the folder (a symbolic link planted there)."""
    for i, rec in enumerate(capture.processes):
        if rec.file is None:
            continue
        why = None if safe_files.is_process_file_name(rec.file) else "not a name the sidecar writes"
        if _refused(capture, f"processes[{i}].file", rec.file, why):
            rec.file, rec.bytes = None, 0
    if _refused(capture, "trace", capture.trace_file):
        capture.trace_file, capture.trace_bytes = None, 0
    if _refused(capture, "summary", capture.summary_file):
        capture.summary_file = None


def _refused(capture: Capture, field: str, name: Any, why: str | None = None) -> bool:
    """Whether ``name`` (the capture.json's ``field``) is refused: ``why``, or what it is on disk."""
    if name is None:
        return False
    why = why or safe_files.not_a_plain_file(capture.dir, name)
    if why is None:
        return False
    log.warning("capture %s: %s: %s %.120r is %s: not served", capture.id, capture.dir / CAPTURE_JSON, field, name, why)
    capture.notes.append(f"capture.json's {field} is {why}: not served")
    return True


def _request(data: dict[str, Any], options: dict[str, Any]) -> CaptureRequest:
    activities = options.get("activities")
    selectors = options.get("processes")
    return CaptureRequest(
        steps=int(data.get("steps") or 0), delay=int(data.get("delay") or 0),
        processes=tuple(_selector(s) for s in selectors) if isinstance(selectors, list) else (),
        timeout_s=float(options.get("timeout_s") or 0) or CaptureRequest.timeout_s,
        activities=tuple(activities) if isinstance(activities, list) else (),
        record_shapes=bool(options.get("record_shapes")), stacks=str(options.get("stacks") or "none"),
        stack_hz=float(options.get("stack_hz") or DEFAULT_STACK_HZ),
        profile_memory=bool(options.get("profile_memory")), with_flops=bool(options.get("with_flops")),
        with_modules=bool(options.get("with_modules")),
        backend="nsys" if options.get("backend") == "nsys" else "torch",
        instance=options.get("instance") if isinstance(options.get("instance"), str) else None,
        fleet=data["fleet"] if isinstance(data.get("fleet"), str) and FLEET_ID.fullmatch(data["fleet"]) else None,
    )


def _selector(text: str) -> ProcessSelector:
    role, _, rank = str(text).partition(":")
    return ProcessSelector(role, int(rank) if rank else None)


def _process(p: dict[str, Any], interrupted: bool) -> CaptureProcess:
    state, error = str(p.get("state") or P_LOST), p.get("error")
    if interrupted and state not in P_TERMINAL:
        state, error = P_LOST, _PROCESS_INTERRUPTED
    # An interrupted capture's files are partial: deleted, never offered.
    partial = {"file": None, "bytes": 0} if interrupted else {}
    rec = CaptureProcess.from_json(p, state=state, error=error, **partial)
    if interrupted and rec.state == P_DONE:
        rec.state, rec.error = P_FAILED, _PROCESS_INTERRUPTED
    return rec


def _clear_leftovers(folder: Path, *, keep_all: bool) -> None:
    """A finished capture keeps its files (only a stray raw folder or temporary file goes); an
    interrupted one keeps nothing but its capture.json."""
    for entry in list(folder.iterdir()):
        if keep_all and entry.name != RAW_DIR and not entry.name.endswith(".tmp"):
            continue
        if entry.name == CAPTURE_JSON:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            disk_space.unlink_quietly(entry)


def _mtime(folder: Path) -> float:
    try:
        return os.stat(folder).st_mtime
    except OSError:
        return 0.0
