"""``/sync/*``, ``/syncs`` and ``/syncs/watch`` (docs/api.md)."""

from __future__ import annotations

from aiohttp import web

from ...syncs.report import merge_watch_reports
from .jobs import JobRoutes
from .keys import REGISTRY, SCANS
from ..jobs.params import parse_scan_request

# /sync/start, /sync/stop, /sync/{id}, /syncs
SCAN_ROUTES = JobRoutes(path="/sync", listing="/syncs", listed_as="scans", what="sync scan", manager=SCANS,
                        parse=parse_scan_request, none_running=("no_active_scan", "no sync scan is running"))


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
    app.add_routes([*SCAN_ROUTES.routes(), web.get("/syncs/watch", syncs_watch)])
