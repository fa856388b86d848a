"""``/profile/*`` and ``/profiles`` (docs/api.md), and the capture's JSON with its download URLs."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .captures import Capture, CaptureProcess, capture_url
from .job_states import FINAL
from .job_routes import ID, start_job, stop_job
from .jobs import CAPTURE
from .keys import CAPTURES
from .params import parse_capture_request


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


def _file_response(capture: Capture, name: str | None, what: str) -> web.StreamResponse:
    if capture.state not in FINAL:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; the {what} is not ready")
    # Only names the capture itself recorded are served, so no request can reach outside its folder.
    if name is None or name not in capture.files() and name != capture.summary_file:
        raise web.HTTPNotFound(text=f"capture {capture.id} has no {what}")
    path = capture.dir / name
    if not path.is_file():
        raise web.HTTPGone(text=f"the {what} of capture {capture.id} was removed")
    headers = {"Content-Disposition": f'attachment; filename="{capture.id}-{name}"'}
    return web.FileResponse(path, headers={**headers, "Content-Type": "application/gzip"})


async def profile_trace(request: web.Request) -> web.StreamResponse:
    capture = _capture_or_404(request)
    return _file_response(capture, capture.trace_file, "merged trace")


async def profile_file(request: web.Request) -> web.StreamResponse:
    capture = _capture_or_404(request)
    name = request.match_info["name"]
    return _file_response(capture, name if name in capture.files() else None, f"file {name!r}")


async def profile_summary(request: web.Request) -> web.Response:
    capture = _capture_or_404(request)
    if capture.state not in FINAL:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; the summary is not ready")
    if not capture.summary_file:
        raise web.HTTPNotFound(text=f"capture {capture.id} has no summary ({capture.headline or 'no trace'})")
    return web.Response(body=(capture.dir / capture.summary_file).read_bytes(), content_type="application/json")


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
