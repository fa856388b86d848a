"""The captures an earlier run of the sidecar left in ``<trace-dir>/captures/``, rebuilt at start.

Each finished capture's folder holds its ``capture.json`` (``GET /profile/{id}``'s object): read
back, it becomes a ``Capture`` again, so a restarted sidecar lists it, serves its files and counts it
for retention. A folder without a readable, final ``capture.json`` is a capture the sidecar was
killed in (or a disk that filled while it was saved): it is ``failed`` with ``INTERRUPTED``, its
leftovers (the raw folder with its traces and stack samples, partial gzip, temporary files) are
deleted and its capture.json rewritten.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from ..protocol import DEFAULT_STACK_HZ, P_DONE, P_FAILED
from . import disk_space
from .captures import Capture, CaptureProcess
from .job_states import FAILED, FINAL, P_LOST, P_TERMINAL
from .jobs import CAPTURE
from .merge import MERGED_NAME, RAW_DIR, SUMMARY_NAME
from .params import CaptureRequest, ProcessSelector
from .saved_jobs import id_time, identity_from_json, read_saved

log = logging.getLogger(__name__)

CAPTURE_JSON = "capture.json"
INTERRUPTED = "interrupted: the sidecar stopped during the capture"
_PROCESS_INTERRUPTED = "the sidecar stopped during the capture"


def restore_captures(trace_dir: Path, render: Callable[[Capture], dict[str, Any]]) -> list[Capture]:
    """Every capture on disk under ``trace_dir``, oldest first; interrupted ones marked and cleaned."""
    root = trace_dir / "captures"
    try:
        folders = [f for f in root.iterdir() if f.is_dir() and CAPTURE.is_id(f.name)]
    except OSError:
        return []
    restored = []
    for folder in folders:
        data = read_saved(folder / CAPTURE_JSON)
        final = data is not None and data.get("state") in FINAL and data.get("id") == folder.name
        try:
            capture = from_json(folder, data if final else data or {}, interrupted=not final)
        except (TypeError, ValueError, KeyError) as exc:  # a capture.json of another version, say
            log.warning("capture %s: capture.json not understood (%s): marked interrupted", folder.name, exc)
            capture, final = from_json(folder, {}, interrupted=True), False
        _clear_leftovers(folder, keep_all=final)
        if not final:
            try:
                disk_space.write_atomic(folder / CAPTURE_JSON, _dumps(render(capture)))
            except OSError as exc:
                log.warning("capture %s: cannot rewrite capture.json: %s", capture.id, disk_space.describe(exc))
        restored.append(capture)
    return sorted(restored, key=lambda c: (c.created_at, c.id))


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
        bound_request=data.get("request") if isinstance(data.get("request"), dict) else None,
    )
    if not interrupted:
        capture.trace_file = MERGED_NAME if data.get("trace") else None
        capture.trace_bytes = int(data.get("trace_bytes") or 0)
        capture.summary_file = SUMMARY_NAME if data.get("summary") else None
        capture.headline = data.get("headline")
    capture.done_event.set()
    return capture


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
        instance=options.get("instance") if isinstance(options.get("instance"), str) else None,
    )


def _selector(text: str) -> ProcessSelector:
    role, _, rank = str(text).partition(":")
    return ProcessSelector(role, int(rank) if rank else None)


def _process(p: dict[str, Any], interrupted: bool) -> CaptureProcess:
    state, error = str(p.get("state") or P_LOST), p.get("error")
    if interrupted and state not in P_TERMINAL:
        state, error = P_LOST, _PROCESS_INTERRUPTED
    rec = CaptureProcess(conn=None, identity=identity_from_json(p), state=state, error=error,
                         steps_recorded=int(p.get("steps_recorded") or 0), first_step=p.get("first_step"),
                         stacks=str(p.get("stacks") or "none"), stack_summary=p.get("stack_summary"),
                         step_thread_ms=float(p.get("step_thread_ms") or 0.0), export_ms=p.get("export_ms"),
                         clock=p.get("clock"))
    if not interrupted:  # an interrupted capture's files are partial: deleted, never offered
        rec.file, rec.bytes = p.get("file"), int(p.get("bytes") or 0)
    elif rec.state == P_DONE:
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


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1)
