"""``/modules/*`` and ``/modules``: the module-timing job's HTTP views (docs/api.md, "Module timing")."""

from __future__ import annotations

from aiohttp import web

from .jobs import JobRoutes
from .keys import MODULES
from ..jobs.params import parse_module_request

# /modules/start, /modules/stop, /modules/{id}, /modules
MODULE_ROUTES = JobRoutes(path="/modules", listing="/modules", listed_as="jobs", what="module timing", manager=MODULES,
                          parse=parse_module_request,
                          none_running=("no_active_module_timing", "no module timing is running"))


def add_module_routes(app: web.Application) -> None:
    app.add_routes(MODULE_ROUTES.routes())
