"""``/triggers``: the HTTP views of the triggers (docs/api.md, "Triggers"; sidecar/service/incidents/triggers.py does the work)."""

from __future__ import annotations

from aiohttp import web

from .keys import SETTINGS, TRIGGERS
from .request_body import json_body
from ..incidents.trigger_rules import parse_rule
from ..incidents.triggers import Trigger


def _trigger_or_404(request: web.Request) -> Trigger:
    trigger_id = request.match_info["id"]
    trigger = request.app[TRIGGERS].get(trigger_id)
    if trigger is None:
        raise web.HTTPNotFound(text=f"no trigger {trigger_id!r} (see /triggers)")
    return trigger


async def create_trigger(request: web.Request) -> web.Response:
    rule = parse_rule(await json_body(request, "the rule"), request.app[SETTINGS].max_steps)
    trigger = request.app[TRIGGERS].add(rule)
    return web.json_response(trigger.to_json(with_firings=True), status=201,
                             headers={"Location": f"/triggers/{trigger.id}"})


async def list_triggers(request: web.Request) -> web.Response:
    return web.json_response({"triggers": [t.to_json() for t in request.app[TRIGGERS].all()]})


async def get_trigger(request: web.Request) -> web.Response:
    return web.json_response(_trigger_or_404(request).to_json(with_firings=True))


async def delete_trigger(request: web.Request) -> web.Response:
    trigger = _trigger_or_404(request)
    request.app[TRIGGERS].delete(trigger.id)
    return web.json_response({"deleted": trigger.id})


def add_trigger_routes(app: web.Application) -> None:
    app.add_routes([
        web.post("/triggers", create_trigger),
        web.get("/triggers", list_triggers),
        web.get("/triggers/{id}", get_trigger),
        web.delete("/triggers/{id}", delete_trigger),
    ])
