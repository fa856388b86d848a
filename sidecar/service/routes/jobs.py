"""What the start and stop routes of every job kind share (``/profile/start``, ``/sync/start``, ...)."""

from __future__ import annotations

from typing import Any, Callable, Mapping

from aiohttp import web

from ...common import config
from ..export.disk_space import DiskFull
from ..jobs.manager import JobManager
from ..jobs.model import CAPTURE, MODULES, SCAN, Job, JobBusy, NoProbes
from .keys import REGISTRY, SETTINGS
from .responses import json_error, start_params

# The running job's kind decides the answer, whichever kind was asked to start (docs/api.md).
_BUSY = {
    CAPTURE.name: ("capture_in_progress", "capture {id} is {state}; wait for it or POST /profile/stop"),
    SCAN.name: ("scan_in_progress", "sync scan {id} is {state}; wait for it or POST /sync/stop"),
    MODULES.name: ("module_timing_in_progress", "module timing {id} is {state}; wait for it or POST /modules/stop"),
}

# The fixed words after a job kind's prefix (/profile/stop, /sync/start): never an id. Its routes' {id}
# refuses them, so a wrong method on /profile/stop is a 405 naming POST, not "no capture 'stop'".
RESERVED_SEGMENTS = ("start", "stop")
ID = "{id:(?!(?:" + "|".join(RESERVED_SEGMENTS) + ")$)[^/]+}"

# parse_capture_request / parse_scan_request: (params, max_steps, connected roles) -> request
Parse = Callable[[Mapping[str, str], int, list[str]], Any]


def job_busy(active: Job) -> web.Response:
    error, message = _BUSY[active.kind.name]
    return json_error(409, error, message.format(id=active.id, state=active.state), active=active.id)


async def start_job(request: web.Request, manager: JobManager, parse: Parse,
                    url: Callable[[str], str]) -> web.Response:
    params = await start_params(request)
    job_request = parse(params, request.app[SETTINGS].max_steps, request.app[REGISTRY].roles())
    try:
        job = await manager.start(job_request)
    except JobBusy as exc:
        return job_busy(exc.active)
    except NoProbes as exc:
        return json_error(503, "no_engine_processes",
                          f"{exc}: is the plugin installed and {config.ENV_ENDPOINT} right?")
    except DiskFull as exc:
        return json_error(507, "insufficient_storage", str(exc))
    return web.json_response(
        {"id": job.id, "state": job.state, "url": url(job.id), "processes": [p.label for p in job.processes]},
        status=202,
    )


async def stop_job(manager: JobManager, url: Callable[[str], str], none_running: tuple[str, str]) -> web.Response:
    job = await manager.stop("stopped by request")
    if job is None:
        return json_error(409, *none_running)
    return web.json_response({"id": job.id, "state": job.state, "url": url(job.id)})


def job_or_404(request: web.Request, manager: JobManager, what: str, listing: str) -> Job:
    """The job ``{id}`` of the route names, or a 404 naming it and where the kind's jobs are listed."""
    job_id = request.match_info["id"]
    job = manager.get(job_id)
    if job is None:
        raise web.HTTPNotFound(text=f"no {what} {job_id!r} (see {listing})")
    return job
