"""``/modules/*`` and ``/modules``: the module-timing job's HTTP views (docs/api.md, "Module timing")."""

from __future__ import annotations

from aiohttp import web

from .jobs import ID, job_or_404, start_job, stop_job
from .keys import MODULES
from ..jobs.params import parse_module_request


def modules_url(job_id: str) -> str:
    return f"/modules/{job_id}"


async def modules_start(request: web.Request) -> web.Response:
    return await start_job(request, request.app[MODULES], parse_module_request, modules_url)


async def modules_stop(request: web.Request) -> web.Response:
    return await stop_job(request.app[MODULES], modules_url, ("no_active_module_timing", "no module timing is running"))


async def modules_status(request: web.Request) -> web.Response:
    return web.json_response(job_or_404(request, request.app[MODULES], "module timing", "/modules").to_json())


async def modules_list(request: web.Request) -> web.Response:
    return web.json_response({"jobs": [j.to_json() for j in request.app[MODULES].recent()]})


def add_module_routes(app: web.Application) -> None:
    app.add_routes([
        web.route("*", "/modules/start", modules_start),
        web.post("/modules/stop", modules_stop),
        web.get(f"/modules/{ID}", modules_status),
        web.get("/modules", modules_list),
    ])
