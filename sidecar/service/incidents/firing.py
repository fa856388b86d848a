"""What a firing does, whoever fired it: a trigger's breach (triggers.py) or an Alertmanager alert
(alerts.py). One path, so that both start the same capture, save the same recorder dump and run the
same scan, and record what happened in the same fields of the firing's record.

``run_firing`` takes a firing record (a dict the caller keeps and serves) and its ``TriggerAction``:
it starts the capture first (``CaptureManager.start``: armed when it returns; another job running:
``capture_skipped: "busy: ..."``) and lets the caller stamp the capture with its cause
(``capture.trigger``, ``capture.alert``: in capture.json at its next save, and in GET /profile/{id}
at once); then saves the flight recorder's last seconds to ``<dump dir>/<firing id>.recorder.json.gz``
(the newest ``KEEP_DUMPS`` of that folder kept); then, when asked, runs the sync scan once the capture
has ended. ``finished(firing)`` runs last, whatever happened (the caller's span). A firing's fault is
logged and recorded as ``reason: "failed: ..."``, never raised into the event loop.

The record's fields this fills: ``capture``, ``capture_skipped``, ``arm_latency_ms`` (from
``arrived``, monotonic, to the capture armed), ``recorder``, ``recorder_error``, ``scan``,
``scan_skipped``, and ``reason`` on a failure (``FIRING_FIELDS``: a new record starts with them None).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import recorder_view
from ..channel.queries import QueryBroker
from ..channel.registry import ProbeRegistry
from ..jobs.captures import Capture, CaptureManager
from ..jobs.model import JobBusy, NoProbes
from ..jobs.params import CaptureRequest, ParamError, ScanRequest
from ..jobs.scans import ScanManager
from .recorder_dump import gather_recording
from .trigger_rules import TriggerAction

log = logging.getLogger(__name__)

KEEP_DUMPS = 20  # recorder dumps of firings kept on disk, per folder (triggers/, alerts/)
DUMP_SUFFIX = ".recorder.json.gz"
FIRING_FIELDS = ("capture", "capture_skipped", "arm_latency_ms", "recorder", "recorder_error", "scan", "scan_skipped")


@dataclass(frozen=True)
class FiringContext:
    """What a firing reaches: the engine processes, the job managers, the query broker, and the folder
    its recorder dumps go to."""

    registry: ProbeRegistry
    captures: CaptureManager
    scans: ScanManager
    queries: QueryBroker
    dump_dir: Path
    on_dump: Callable[[Path], None] | None = None  # told of each dump saved (its upload to the object store)


async def run_firing(ctx: FiringContext, firing: dict[str, Any], action: TriggerAction, arrived: float, *,
                     started_by: Callable[[Capture], None], finished: Callable[[dict[str, Any]], None]) -> None:
    """Carry out ``action`` for ``firing`` (its ``id`` names the dump), filling in the record."""
    capture = None
    try:
        if action.capture_steps:
            capture = await _capture(ctx, firing, action.capture_steps, arrived, started_by)
        if action.recorder_seconds:
            await _save_recording(ctx, firing, action.recorder_seconds)
        if action.sync_scan:
            if capture is not None:
                await capture.done_event.wait()
            await _scan(ctx, firing, action.capture_steps)
    except Exception as exc:  # a firing's fault must never reach the event loop's other work
        log.exception("firing %s failed", firing["id"])
        firing["reason"] = f"failed: {exc}"
    finally:
        finished(firing)


async def _capture(ctx: FiringContext, firing: dict[str, Any], steps: int, arrived: float,
                   started_by: Callable[[Capture], None]) -> Capture | None:
    try:
        capture = await ctx.captures.start(CaptureRequest(steps=steps))
    except JobBusy as exc:
        firing["capture_skipped"] = f"busy: {exc}"
        return None
    except (NoProbes, ParamError, OSError) as exc:
        firing["capture_skipped"] = str(exc)
        return None
    except Exception as exc:  # e.g. the disk-space floor (507 on /profile/start)
        firing["capture_skipped"] = f"{type(exc).__name__}: {exc}"
        return None
    firing["arm_latency_ms"] = round((time.monotonic() - arrived) * 1000, 3)
    firing["capture"] = capture.id
    started_by(capture)
    return capture


async def _save_recording(ctx: FiringContext, firing: dict[str, Any], seconds: float) -> None:
    conns = ctx.registry.all()
    if not conns:
        firing["recorder_error"] = "no engine process is connected"
        return
    answers, since_ns, until_ns = await gather_recording(ctx.queries, conns, seconds)
    path = ctx.dump_dir / (firing["id"] + DUMP_SUFFIX)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, _write_recording, path, answers, since_ns, until_ns)
    except OSError as exc:
        firing["recorder_error"] = f"not saved: {exc}"
        return
    firing["recorder"] = str(path)
    if ctx.on_dump is not None:
        ctx.on_dump(path)  # queued, never awaited: the upload runs in the background


async def _scan(ctx: FiringContext, firing: dict[str, Any], steps: int) -> None:
    try:
        scan = await ctx.scans.start(ScanRequest(steps=steps))
    except JobBusy as exc:
        firing["scan_skipped"] = f"busy: {exc}"
        return
    except Exception as exc:
        firing["scan_skipped"] = f"{type(exc).__name__}: {exc}"
        return
    firing["scan"] = scan.id


def _write_recording(path: Path, answers: list, since_ns: int, until_ns: int) -> None:
    """The merged recording as gzip JSON, written whole (a temporary renamed), then the oldest dumps
    of its folder past ``KEEP_DUMPS`` removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = gzip.compress(json.dumps(recorder_view.merge(answers, since_ns, until_ns), separators=(",", ":")).encode(), 5)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    dumps = sorted(path.parent.glob("*" + DUMP_SUFFIX), key=lambda p: p.stat().st_mtime)
    for old in dumps[:-KEEP_DUMPS]:
        old.unlink(missing_ok=True)
