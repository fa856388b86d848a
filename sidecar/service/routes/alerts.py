"""``/alerts``: Alertmanager's webhook, and what came of it (docs/api.md, "Alerts"; the work is
sidecar/service/incidents/alerts.py).

``POST /alerts`` is behind the token like every route (Alertmanager presents it:
``http_config.authorization``). Its body is bounded (``MAX_BODY_BYTES``, a 413 beyond, read no
further), parsed and checked whole before any alert is acted on (a 400 naming the field), then
decided alert by alert without awaiting a capture: the answer says what became of each.
"""

from __future__ import annotations

from aiohttp import web

from ..incidents.alert_payload import parse_payload
from ..incidents.alerts import Alerts
from .request_body import json_body

ALERTS = web.AppKey("alerts", Alerts)
MAX_BODY_BYTES = 4 << 20  # about 2,500 alerts as Prometheus and Alertmanager write them


def _reached(request: web.Request) -> tuple[str, int] | None:
    """The address and port this request reached the sidecar at (the instance Prometheus scrapes, unless
    a proxy or a port mapping stands between)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return str(sockname[0]), int(sockname[1])
    return None


async def receive_alerts(request: web.Request) -> web.Response:
    alerts = parse_payload(await json_body(request, "Alertmanager's webhook notification", max_bytes=MAX_BODY_BYTES))
    return web.json_response(request.app[ALERTS].receive(alerts, _reached(request)))


async def list_alerts(request: web.Request) -> web.Response:
    return web.json_response(request.app[ALERTS].to_json())


def add_alert_routes(app: web.Application) -> None:
    app.add_routes([web.post("/alerts", receive_alerts), web.get("/alerts", list_alerts)])
