"""``/profile/*`` and ``/profiles`` (docs/api.md): a capture's JSON (``Capture.to_json``) and its downloads.

A capture's files are served only by names it recorded, each opened by sidecar/service/export/safe_files.py (a name the
sidecar writes, in the capture's own folder, no link followed) and streamed from that descriptor:
anything else answers a JSON 404, a file removed 410, never a 500 nor another file (issue 27).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import BinaryIO

from aiohttp import web

from ..export import safe_files
from ..store.reader import FetchFailed
from ..jobs.captures import Capture
from ..jobs.states import FINAL
from .jobs import ID, JobRoutes
from .keys import CAPTURES
from ..jobs.params import parse_capture_request

log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 18  # streamed: a merged trace can be gigabytes


# /profile/start, /profile/stop, /profile/{id}, /profiles. A capture's URL, /profile/{id}, is also jobs/capture.py's
# capture_url, which its JSON's links and its verdict use.
CAPTURE_ROUTES = JobRoutes(path="/profile", listing="/profiles", listed_as="captures", what="capture",
                           manager=CAPTURES, parse=parse_capture_request,
                           none_running=("no_active_capture", "no capture is running"))


def _capture_or_404(request: web.Request) -> Capture:
    return CAPTURE_ROUTES.job_or_404(request)


async def _open(request: web.Request, capture: Capture, name: str | None, what: str) -> BinaryIO:
    """The capture's file ``name``, opened safely: 409 while it runs, 404 for a name it did not
    record or what is not its own regular file (a link, say), 410 for a file removed; a file of a
    capture in the object store and not on this disk is downloaded first (502 naming why it could not be)."""
    if capture.state not in FINAL:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; the {what} is not ready")
    # Only names the capture itself recorded are served, so no request can reach outside its folder.
    if name is None or name not in capture.files() and name != capture.summary_file:
        raise web.HTTPNotFound(text=f"capture {capture.id} has no {what}")
    try:
        await request.app[CAPTURES].ensure_local(capture, name)
    except FetchFailed as exc:
        raise web.HTTPBadGateway(text=f"the {what} of capture {capture.id} could not be fetched from the store: {exc}")
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
    file = await _open(request, capture, name, what)
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
    return await _stream(request, await _open(request, capture, capture.summary_file, "summary"), "application/json")


def add_capture_routes(app: web.Application) -> None:
    app.add_routes([
        *CAPTURE_ROUTES.routes(),
        web.get(f"/profile/{ID}/trace", profile_trace),
        web.get(f"/profile/{ID}/files/{{name}}", profile_file),
        web.get(f"/profile/{ID}/summary", profile_summary),
    ])
