"""``/sync/*``, ``/syncs`` and ``/syncs/watch`` (docs/api.md)."""

from __future__ import annotations

from aiohttp import web

from ...syncs.report import merge_watch_reports
from .jobs import ID, job_or_404, start_job, stop_job
from .keys import REGISTRY, SCANS
from ..jobs.params import parse_scan_request


def scan_url(scan_id: str) -> str:
    return f"/sync/{scan_id}"


async def sync_start(request: web.Request) -> web.Response:
    return await start_job(request, request.app[SCANS], parse_scan_request, scan_url)


async def sync_stop(request: web.Request) -> web.Response:
    return await stop_job(request.app[SCANS], scan_url, ("no_active_scan", "no sync scan is running"))


async def sync_status(request: web.Request) -> web.Response:
    return web.json_response(job_or_404(request, request.app[SCANS], "sync scan", "/syncs").to_json())


async def syncs(request: web.Request) -> web.Response:
    return web.json_response({"scans": [s.to_json() for s in request.app[SCANS].recent()]})


async def syncs_watch(request: web.Request) -> web.Response:
    """The always-on sync watch of every connected process (docs/api.md), sites merged."""
    reports = []
    for conn in request.app[REGISTRY].all():
        if conn.sync_watch is not None:
            reports.append({**conn.sync_watch, "process": conn.identity.label})
    return web.json_response({
        "processes": [{k: v for k, v in r.items() if k != "sites"} for r in reports],
        "sites": merge_watch_reports(reports),
    })


def add_scan_routes(app: web.Application) -> None:
    app.add_routes([
        web.route("*", "/sync/start", sync_start),
        web.post("/sync/stop", sync_stop),
        web.get(f"/sync/{ID}", sync_status),
        web.get("/syncs", syncs),
        web.get("/syncs/watch", syncs_watch),
    ])
