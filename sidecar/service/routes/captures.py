"""``/profile/*`` and ``/profiles`` (docs/api.md), and the capture's JSON with its download URLs.

A capture's files are served only by names it recorded, each opened by sidecar/service/export/safe_files.py (a name the
sidecar writes, in the capture's own folder, no link followed) and streamed from that descriptor:
anything else answers a JSON 404, a file removed 410, never a 500 nor another file (issue 27).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, BinaryIO

from aiohttp import web

from ..export import safe_files
from ..jobs.captures import Capture, CaptureProcess, capture_url
from ..jobs.states import FINAL
from .jobs import ID, start_job, stop_job
from ..jobs.model import CAPTURE
from .keys import CAPTURES
from ..jobs.params import parse_capture_request

log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 18  # streamed: a merged trace can be gigabytes


def capture_json(capture: Capture) -> dict[str, Any]:
    """``GET /profile/{id}``, also saved as the capture's capture.json: the same object."""
    url, r = capture_url(capture.id), capture.request
    return {
        "id": capture.id,
        "state": capture.state,
        "reason": capture.reason,
        "notes": capture.notes,
        "steps": r.steps,
        "start_step": capture.start_step,
        "start_steps": capture.start_steps,
        "delay": r.delay,
        "created_at": capture.created_at,
        "finished_at": capture.finished_at,
        "headline": capture.headline,
        "trace": f"{url}/trace" if capture.trace_file else None,
        "trace_bytes": capture.trace_bytes,
        "summary": f"{url}/summary" if capture.summary_file else None,
        "processes": [_process_json(p) for p in capture.processes],
        "trigger": capture.trigger,
        "request": capture.bound_request,
        "files": {name: f"{url}/files/{name}" for name in capture.files()},
        "options": {
            "activities": list(r.activities) or "host default",
            "record_shapes": r.record_shapes, "with_stack": r.with_stack,
            "stacks": r.stacks, "stack_hz": r.stack_hz if r.with_stack else None,
            "profile_memory": r.profile_memory, "with_flops": r.with_flops, "with_modules": r.with_modules,
            "timeout_s": r.timeout_s,
            "processes": [f"{s.role}:{s.rank}" if s.rank is not None else s.role for s in r.processes] or "all",
            "instance": r.instance,
        },
    }


def _process_json(p: CaptureProcess) -> dict[str, Any]:
    return {
        "role": p.role, "pid": p.pid, "rank": p.rank, "label": p.label, "instance": p.identity.instance,
        "state": p.state, "steps_recorded": p.steps_recorded, "first_step": p.first_step,
        "file": p.file, "bytes": p.bytes, "error": p.error,
        "stacks": p.stacks, "stack_summary": p.stack_summary,
        "step_thread_ms": p.step_thread_ms, "export_ms": p.export_ms,
        "clock": p.clock,
    }


async def profile_start(request: web.Request) -> web.Response:
    return await start_job(request, request.app[CAPTURES], parse_capture_request, capture_url)


async def profile_stop(request: web.Request) -> web.Response:
    return await stop_job(request.app[CAPTURES], capture_url, ("no_active_capture", "no capture is running"))


def _capture_or_404(request: web.Request) -> Capture:
    capture_id = request.match_info["id"]
    capture = request.app[CAPTURES].get(capture_id) if CAPTURE.is_id(capture_id) else None
    if capture is None:
        raise web.HTTPNotFound(text=f"no capture {capture_id!r} (see /profiles)")
    return capture


async def profile_status(request: web.Request) -> web.Response:
    return web.json_response(capture_json(_capture_or_404(request)))


def _open(capture: Capture, name: str | None, what: str) -> BinaryIO:
    """The capture's file ``name``, opened safely: 409 while it runs, 404 for a name it did not
    record or what is not its own regular file (a link, say), 410 for a file removed."""
    if capture.state not in FINAL:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; the {what} is not ready")
    # Only names the capture itself recorded are served, so no request can reach outside its folder.
    if name is None or name not in capture.files() and name != capture.summary_file:
        raise web.HTTPNotFound(text=f"capture {capture.id} has no {what}")
    try:
        return safe_files.open_capture_file(capture.dir, name)
    except FileNotFoundError:
        raise web.HTTPGone(text=f"the {what} of capture {capture.id} was removed") from None
    except (safe_files.NotInFolder, OSError) as exc:
        log.warning("capture %s: %s not served: %s", capture.id, what, exc)
        raise web.HTTPNotFound(text=f"capture {capture.id} has no {what} that can be served") from None


async def _stream(request: web.Request, file: BinaryIO, content_type: str,
                  headers: dict[str, str] | None = None) -> web.StreamResponse:
    """Send the open ``file`` (then closed) as the answer, read off the event loop, never more than
    the size it had when opened."""
    with file:
        left = os.fstat(file.fileno()).st_size
        response = web.StreamResponse(headers=headers)
        response.content_type = content_type
        response.content_length = left
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        while left > 0 and request.method != "HEAD":
            data = await loop.run_in_executor(None, file.read, min(_READ_CHUNK, left))
            if not data:  # cut short since it was opened: the client sees the length unmet
                break
            left -= len(data)
            await response.write(data)
        await response.write_eof()
    return response


async def _download(request: web.Request, capture: Capture, name: str | None, what: str) -> web.StreamResponse:
    file = _open(capture, name, what)
    headers = {"Content-Disposition": f'attachment; filename="{capture.id}-{name}"'}
    return await _stream(request, file, "application/gzip", headers)


async def profile_trace(request: web.Request) -> web.StreamResponse:
    capture = _capture_or_404(request)
    return await _download(request, capture, capture.trace_file, "merged trace")


async def profile_file(request: web.Request) -> web.StreamResponse:
    capture = _capture_or_404(request)
    name = request.match_info["name"]
    return await _download(request, capture, name if name in capture.files() else None, f"file {name!r}")


async def profile_summary(request: web.Request) -> web.StreamResponse:
    capture = _capture_or_404(request)
    if capture.state not in FINAL:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; the summary is not ready")
    if not capture.summary_file:
        raise web.HTTPNotFound(text=f"capture {capture.id} has no summary ({capture.headline or 'no trace'})")
    return await _stream(request, _open(capture, capture.summary_file, "summary"), "application/json")


async def profiles(request: web.Request) -> web.Response:
    return web.json_response({"captures": [capture_json(c) for c in request.app[CAPTURES].recent()]})


def add_capture_routes(app: web.Application) -> None:
    app.add_routes([
        web.route("*", "/profile/start", profile_start),
        web.post("/profile/stop", profile_stop),
        web.get(f"/profile/{ID}", profile_status),
        web.get(f"/profile/{ID}/trace", profile_trace),
        web.get(f"/profile/{ID}/files/{{name}}", profile_file),
        web.get(f"/profile/{ID}/summary", profile_summary),
        web.get("/profiles", profiles),
    ])
