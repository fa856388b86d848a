"""``/memory/*`` and ``/memory``: the memory-snapshot job's HTTP views (docs/api.md, "Memory snapshot").

Besides the routes every job kind has: ``GET /memory/{id}/files/{name}``, a process's raw snapshot (a
pickle for PyTorch's memory viewer, served as bytes by the names the job recorded, opened by
sidecar/service/export/safe_files.py: never another file, never through a link), and
``GET /memory/{id}/page``, the summary as a page (sidecar/report/memory_page.py).
"""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web

from ...report.document import policy
from ...report.memory_page import render_memory_page
from ..export import safe_files
from ..jobs.states import FINAL
from ..jobs.params import parse_memory_request
from .jobs import ID, JobRoutes
from .keys import MEMORY

log = logging.getLogger(__name__)

_READ_CHUNK = 1 << 18

# /memory/start, /memory/stop, /memory/{id}, /memory
MEMORY_ROUTES = JobRoutes(path="/memory", listing="/memory", listed_as="jobs", what="memory snapshot",
                          manager=MEMORY, parse=parse_memory_request,
                          none_running=("no_active_memory_snapshot", "no memory snapshot is running"))


async def memory_file(request: web.Request) -> web.StreamResponse:
    """One process's raw snapshot: 409 while the job runs, 404 for a name it did not record, 410 once removed."""
    job = MEMORY_ROUTES.job_or_404(request)
    name = request.match_info["name"]
    if job.state not in FINAL:
        raise web.HTTPConflict(text=f"memory snapshot {job.id} is {job.state}; its files are not ready")
    manager = request.app[MEMORY]
    path = manager.raw_path(job, name)
    if path is None:
        raise web.HTTPNotFound(text=f"memory snapshot {job.id} has no file {name!r}")
    try:
        file = safe_files.open_in_folder(path.parent, path.name)
    except FileNotFoundError:
        raise web.HTTPGone(text=f"the file {name!r} of memory snapshot {job.id} was removed") from None
    except (safe_files.NotInFolder, OSError) as exc:
        log.warning("memory snapshot %s: %s not served: %s", job.id, name, exc)
        raise web.HTTPNotFound(text=f"memory snapshot {job.id} has no file {name!r} that can be served") from None
    with file:
        left = os.fstat(file.fileno()).st_size
        response = web.StreamResponse(headers={"Content-Disposition": f'attachment; filename="{job.id}-{name}"'})
        response.content_type = "application/octet-stream"
        response.content_length = left
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        while left > 0 and request.method != "HEAD":
            data = await loop.run_in_executor(None, file.read, min(_READ_CHUNK, left))
            if not data:
                break
            left -= len(data)
            await response.write(data)
        await response.write_eof()
    return response


async def memory_page(request: web.Request) -> web.Response:
    """The summary as a page, for a browser; no script (its policy allows none)."""
    job = MEMORY_ROUTES.job_or_404(request)
    return web.Response(text=render_memory_page(job.to_json()), content_type="text/html", charset="utf-8", headers={
        "Content-Security-Policy": policy(interactive=False) + "; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})


def add_memory_routes(app: web.Application) -> None:
    app.add_routes([
        *MEMORY_ROUTES.routes(),
        web.get(f"/memory/{ID}/files/{{name}}", memory_file),
        web.get(f"/memory/{ID}/page", memory_page),
    ])
