"""The sidecar's HTTP API (aiohttp). Endpoints are documented in docs/api.md; keep them stable."""

from __future__ import annotations

import json
import logging
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from .. import __version__, auth
from ..protocol import PROBE_WS_PATH, ProcessIdentity
from . import merge
from .metrics_receiver import CAPTURE_METRICS, METRICS_REGISTRY, add_metrics_routes
from .sync_findings import SyncFindings, WatchCollector
from .captures import FINAL_STATES, CaptureBusy, CaptureManager, NoProbes
from .params import ParamError, parse_capture_request, parse_scan_request
from .scans import FINAL as SCAN_FINAL
from .scans import ScanManager
from .registry import ProbeRegistry
from ..syncs.report import merge_watch_reports

log = logging.getLogger(__name__)

CAPTURE_ID_RE = re.compile(r"^[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$")


@dataclass(frozen=True)
class ServiceSettings:
    trace_dir: Path
    probe_token: str  # always required on the probe channel
    http_token: str | None  # required on the HTTP API when set
    max_steps: int
    max_capture_bytes: int
    keep: int
    stop_grace_s: float = 10.0  # how long stopped processes get to report before they count as lost


SETTINGS = web.AppKey("settings", ServiceSettings)
REGISTRY = web.AppKey("registry", ProbeRegistry)
CAPTURES = web.AppKey("captures", CaptureManager)
SCANS = web.AppKey("scans", ScanManager)

routes = web.RouteTableDef()


def json_error(status: int, error: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": error, "message": message, **extra}, status=status)


@web.middleware
async def errors_and_auth(request: web.Request, handler):
    settings = request.app[SETTINGS]
    token = settings.http_token
    # The probe channel and the metrics push carry the probe token, checked by their handlers.
    if token and request.path not in ("/healthz", PROBE_WS_PATH, "/v1/metrics"):
        if not auth.bearer_matches(request.headers.get("Authorization"), token):
            return json_error(401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
    try:
        return await handler(request)
    except ParamError as exc:
        return web.json_response(exc.to_json(), status=400)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(exc.status, exc.reason.lower().replace(" ", "_"), exc.text or exc.reason)


# -- captures -----------------------------------------------------------------------------------------
@routes.route("*", "/profile/start")
async def profile_start(request: web.Request) -> web.Response:
    capture_request = parse_capture_request(await _start_params(request), request.app[SETTINGS].max_steps)
    manager = request.app[CAPTURES]
    scan = request.app[SCANS].active
    if scan is not None:  # the profiler would record the detector's own overhead
        return json_error(409, "scan_in_progress", f"sync scan {scan.id} is {scan.state}; wait for it or POST /sync/stop",
                          active=scan.id)
    try:
        capture = await manager.start(capture_request)
    except CaptureBusy as exc:
        return json_error(409, "capture_in_progress", f"capture {exc.active.id} is {exc.active.state}; "
                          "wait for it or POST /profile/stop", active=exc.active.id)
    except NoProbes as exc:
        return json_error(503, "no_engine_processes", f"{exc}: is the plugin installed and SIDECAR_ENDPOINT right?")
    return web.json_response(
        {"id": capture.id, "state": capture.state, "url": f"/profile/{capture.id}",
         "processes": [p.label for p in capture.processes]},
        status=202,
    )


async def _start_params(request: web.Request) -> dict[str, str]:
    """Parameters of a start request: the query string, plus a form or JSON body on POST."""
    if request.method not in ("GET", "POST"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"], text="use GET or POST")
    params = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        params.update(await _body_params(request))
    return params


async def _body_params(request: web.Request) -> dict[str, str]:
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise ParamError("body", f"invalid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ParamError("body", "must be a JSON object")
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in body.items()}
    return {k: str(v) for k, v in (await request.post()).items()}


@routes.post("/profile/stop")
async def profile_stop(request: web.Request) -> web.Response:
    capture = await request.app[CAPTURES].stop("stopped by request")
    if capture is None:
        return json_error(409, "no_active_capture", "no capture is running")
    return web.json_response({"id": capture.id, "state": capture.state, "url": f"/profile/{capture.id}"})


def _capture_or_404(request: web.Request):
    capture_id = request.match_info["id"]
    capture = request.app[CAPTURES].get(capture_id) if CAPTURE_ID_RE.match(capture_id) else None
    if capture is None:
        raise web.HTTPNotFound(text=f"no capture {capture_id!r} (see /profiles)")
    return capture


@routes.get("/profile/{id}")
async def profile_status(request: web.Request) -> web.Response:
    return web.json_response(_capture_or_404(request).to_json())


def _file_response(capture, name: str | None, what: str) -> web.StreamResponse:
    if capture.state not in FINAL_STATES:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; the {what} is not ready")
    # Only names the capture itself recorded are served, so no request can reach outside its folder.
    if name is None or name not in capture.files() and name != capture.summary_file:
        raise web.HTTPNotFound(text=f"capture {capture.id} has no {what}")
    path = capture.dir / name
    if not path.is_file():
        raise web.HTTPGone(text=f"the {what} of capture {capture.id} was removed")
    headers = {"Content-Disposition": f'attachment; filename="{capture.id}-{name}"'}
    return web.FileResponse(path, headers={**headers, "Content-Type": "application/gzip"})


@routes.get("/profile/{id}/trace")
async def profile_trace(request: web.Request) -> web.StreamResponse:
    capture = _capture_or_404(request)
    return _file_response(capture, capture.trace_file, "merged trace")


@routes.get("/profile/{id}/files/{name}")
async def profile_file(request: web.Request) -> web.StreamResponse:
    capture = _capture_or_404(request)
    name = request.match_info["name"]
    return _file_response(capture, name if name in capture.files() else None, f"file {name!r}")


@routes.get("/profile/{id}/summary")
async def profile_summary(request: web.Request) -> web.Response:
    capture = _capture_or_404(request)
    if capture.state not in FINAL_STATES:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; the summary is not ready")
    if not capture.summary_file:
        raise web.HTTPNotFound(text=f"capture {capture.id} has no summary ({capture.headline or 'no trace'})")
    return web.Response(body=(capture.dir / capture.summary_file).read_bytes(), content_type="application/json")


@routes.get("/profiles")
async def profiles(request: web.Request) -> web.Response:
    return web.json_response({"captures": [c.to_json() for c in request.app[CAPTURES].recent()]})


# -- hidden-sync scans -------------------------------------------------------------------------------
@routes.route("*", "/sync/start")
async def sync_start(request: web.Request) -> web.Response:
    scan_request = parse_scan_request(await _start_params(request), request.app[SETTINGS].max_steps)
    capture = request.app[CAPTURES].active
    if capture is not None:
        return json_error(409, "capture_in_progress", f"capture {capture.id} is {capture.state}; wait for it or "
                          "POST /profile/stop", active=capture.id)
    try:
        scan = await request.app[SCANS].start(scan_request)
    except CaptureBusy as exc:
        return json_error(409, "scan_in_progress", f"sync scan {exc.active.id} is {exc.active.state}; wait for it "
                          "or POST /sync/stop", active=exc.active.id)
    except NoProbes as exc:
        return json_error(503, "no_engine_processes", f"{exc}: is the plugin installed and SIDECAR_ENDPOINT right?")
    return web.json_response({"id": scan.id, "state": scan.state, "url": f"/sync/{scan.id}",
                              "processes": [p.label for p in scan.processes]}, status=202)


@routes.post("/sync/stop")
async def sync_stop(request: web.Request) -> web.Response:
    scan = await request.app[SCANS].stop("stopped by request")
    if scan is None:
        return json_error(409, "no_active_scan", "no sync scan is running")
    return web.json_response({"id": scan.id, "state": scan.state, "url": f"/sync/{scan.id}"})


@routes.get("/sync/{id}")
async def sync_status(request: web.Request) -> web.Response:
    scan_id = request.match_info["id"]
    scan = request.app[SCANS].get(scan_id)
    if scan is None:
        raise web.HTTPNotFound(text=f"no sync scan {scan_id!r} (see /syncs)")
    return web.json_response(scan.to_json())


@routes.get("/syncs")
async def syncs(request: web.Request) -> web.Response:
    return web.json_response({"scans": [s.to_json() for s in request.app[SCANS].recent()]})


@routes.get("/syncs/watch")
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


# -- processes and health ----------------------------------------------------------------------------
@routes.get("/processes")
async def processes(request: web.Request) -> web.Response:
    return web.json_response({"processes": [c.to_json() for c in request.app[REGISTRY].all()]})


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    active = request.app[CAPTURES].active
    return web.json_response({
        "status": "ok", "version": __version__, "processes": len(request.app[REGISTRY]),
        "active_capture": active.id if active else None,
    })


# -- the probe channel -------------------------------------------------------------------------------
@routes.get(PROBE_WS_PATH)
async def probe_ws(request: web.Request) -> web.StreamResponse:
    if not auth.bearer_matches(request.headers.get("Authorization"), request.app[SETTINGS].probe_token):
        return json_error(401, "unauthorized", "probe token missing or wrong")
    ws = web.WebSocketResponse(heartbeat=10, max_msg_size=1 << 20)
    await ws.prepare(request)
    registry, manager = request.app[REGISTRY], request.app[CAPTURES]
    conn = None
    try:
        first = await ws.receive(timeout=10)
        if first.type != WSMsgType.TEXT:
            return ws
        try:
            identity = ProcessIdentity.from_hello(json.loads(first.data))
        except (ValueError, KeyError, TypeError) as exc:
            await ws.close(code=4400, message=f"bad hello: {exc}".encode()[:120])
            return ws
        conn = registry.add(identity, ws)
        log.info("probe connected: %s", identity.label)
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                break
            try:
                data = json.loads(msg.data)
            except json.JSONDecodeError:
                continue
            if data.get("type") == "heartbeat":
                conn.observe_steps(int(data.get("steps") or 0), time.time())
                if isinstance(data.get("sync_watch"), dict):
                    conn.sync_watch = data["sync_watch"]
            elif data.get("type") == "capture":
                await manager.on_probe_report(conn, data)
            elif data.get("type") == "sync":
                request.app[SCANS].on_probe_report(conn, data)
    finally:
        if conn is not None:
            registry.remove(conn)
            log.info("probe disconnected: %s", conn.identity.label)
            await manager.on_probe_lost(conn)
            request.app[SCANS].on_probe_lost(conn)
    return ws


def make_app(settings: ServiceSettings) -> web.Application:
    app = web.Application(middlewares=[errors_and_auth])
    app[SETTINGS] = settings
    app[REGISTRY] = ProbeRegistry()
    settings.trace_dir.mkdir(parents=True, exist_ok=True)

    async def lifecycle(app: web.Application):
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sidecar-export", initializer=merge.lower_priority)
        metrics = app[CAPTURE_METRICS]
        app[CAPTURES] = CaptureManager(
            app[REGISTRY], settings.trace_dir, executor, settings.max_capture_bytes, settings.keep,
            settings.stop_grace_s,
            on_finished=lambda c: metrics.observe(c.state, sum(p.steps_recorded for p in c.processes),
                                                  c.trace_bytes, (c.finished_at or c.created_at) - c.created_at),
        )
        findings = SyncFindings(app[METRICS_REGISTRY])
        app[METRICS_REGISTRY].register(WatchCollector(app[REGISTRY]))
        app[SCANS] = ScanManager(app[REGISTRY], settings.trace_dir / "scans", settings.keep, settings.stop_grace_s,
                                 on_finished=findings.observe)
        yield
        await app[SCANS].close()
        await app[CAPTURES].close()
        for ws in [c.ws for c in app[REGISTRY].all()]:
            await ws.close()
        executor.shutdown(wait=False, cancel_futures=True)

    app.cleanup_ctx.append(lifecycle)
    app.add_routes(routes)
    # One Prometheus target for every engine process: probes push OTLP metrics, /metrics serves them.
    add_metrics_routes(app, push_token=settings.probe_token)
    return app
