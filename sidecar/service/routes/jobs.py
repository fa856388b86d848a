"""The routes every job kind has, one helper for all (``/profile/*``, ``/sync/*``, ``/modules/*``).

``JobRoutes`` is one kind's start, stop, status and list routes; what differs between the kinds is
its fields, written where the kind's routes are (captures.py, scans.py, modules.py), with the kind's
other routes (a capture's downloads, the sync watch) beside them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from aiohttp import web

from ...common import config
from ..export.disk_space import DiskFull
from ..jobs.model import CAPTURE, MODULES, SCAN, Job, JobBusy, NoProbes
from ..jobs.model import MEMORY
from .keys import REGISTRY, SETTINGS
from .responses import json_error, start_params

# The running job's kind decides the answer, whichever kind was asked to start (docs/api.md).
_BUSY = {
    CAPTURE.name: ("capture_in_progress", "capture {id} is {state}; wait for it or POST /profile/stop"),
    SCAN.name: ("scan_in_progress", "sync scan {id} is {state}; wait for it or POST /sync/stop"),
    MODULES.name: ("module_timing_in_progress", "module timing {id} is {state}; wait for it or POST /modules/stop"),
    MEMORY.name: ("memory_snapshot_in_progress", "memory snapshot {id} is {state}; wait for it or POST /memory/stop"),
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


@dataclass(frozen=True)
class JobRoutes:
    """One job kind's routes (docs/api.md), each job answered as its ``to_json()``:

        *    {path}/start   start one (202); start_params takes GET's query or POST's body, refuses the rest
        POST {path}/stop    stop the running one early (409 ``none_running`` when none runs)
        GET  {path}/{id}    one job (404 naming ``listing``)
        GET  {listing}      the recent ones, newest first: ``{listed_as: [...]}``
    """

    path: str  # "/profile": a job's URL is {path}/{id}
    listing: str  # "/profiles"
    listed_as: str  # "captures": the listing's one field
    what: str  # "capture": the kind in a 404's message
    manager: web.AppKey[Any]  # the kind's JobManager
    parse: Parse  # the start's parameters, validated (a ParamError: 400)
    none_running: tuple[str, str]  # the stop's 409 when none runs: error code, message

    def url(self, job_id: str) -> str:
        return f"{self.path}/{job_id}"

    def routes(self) -> list[web.RouteDef]:
        return [
            web.route("*", f"{self.path}/start", self.start),
            web.post(f"{self.path}/stop", self.stop),
            web.get(f"{self.path}/{ID}", self.status),
            web.get(self.listing, self.recent),
        ]

    def find(self, request: web.Request, key: str = "id") -> Any:
        """The job the route's ``key`` names, or None (a name that is not one of the kind's ids included)."""
        job_id = request.match_info[key]
        manager = request.app[self.manager]
        return manager.get(job_id) if manager.kind.is_id(job_id) else None

    def not_found(self, job_id: str) -> str:
        return f"no {self.what} {job_id!r} (see {self.listing})"

    def job_or_404(self, request: web.Request, key: str = "id") -> Any:
        """The job the route's ``key`` names, or a 404 naming it and where the kind's jobs are listed."""
        job = self.find(request, key)
        if job is None:
            raise web.HTTPNotFound(text=self.not_found(request.match_info[key]))
        return job

    async def start(self, request: web.Request) -> web.Response:
        params = await start_params(request)
        job_request = self.parse(params, request.app[SETTINGS].max_steps, request.app[REGISTRY].roles())
        try:
            job = await request.app[self.manager].start(job_request)
        except JobBusy as exc:
            return job_busy(exc.active)
        except NoProbes as exc:
            return json_error(503, "no_engine_processes",
                              f"{exc}: is the plugin installed and {config.ENV_ENDPOINT} right?")
        except DiskFull as exc:
            return json_error(507, "insufficient_storage", str(exc))
        return web.json_response(
            {"id": job.id, "state": job.state, "url": self.url(job.id), "processes": [p.label for p in job.processes]},
            status=202,
        )

    async def stop(self, request: web.Request) -> web.Response:
        job = await request.app[self.manager].stop("stopped by request")
        if job is None:
            return json_error(409, *self.none_running)
        return web.json_response({"id": job.id, "state": job.state, "url": self.url(job.id)})

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response(self.job_or_404(request).to_json())

    async def recent(self, request: web.Request) -> web.Response:
        return web.json_response({self.listed_as: [j.to_json() for j in request.app[self.manager].recent()]})
