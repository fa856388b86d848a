"""The sidecar's HTTP API (aiohttp). Endpoints are documented in docs/api.md; keep them stable.

This module assembles the service (``make_app``): settings and shared state (routes/keys.py), the
refusal of what a web page in the user's browser sends (browser_guard.py), authentication and JSON
errors, ``/healthz`` (here), and the routes of routes/: captures (captures.py) and their diff
(diff.py), sync scans (scans.py), module timing (modules.py), the incident views (incidents.py:
recorder, stacks, requests), triggers (triggers.py), Alertmanager's webhook (alerts.py), the probe channel and ``/processes``
(probe_channel.py), the metrics receiver (metrics.py) and the pages a person opens in a browser
(pages.py).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from ..common.version import __version__
from ..common import auth
from ..common.protocol import METRICS_PUSH_PATH, PROBE_WS_PATH
from ..common.protocol import DEFAULT_MEMORY_FILE_BYTES
from .export import merge
from .browser_guard import browser_guard
from .routes.captures import add_capture_routes
from .routes.diff import add_diff_routes
from .metrics.engine_state import EngineStateCollector
from .routes.incidents import add_incident_routes
from .jobs.captures import Capture, CaptureManager
from .jobs.board import JobBoard
from .routes.keys import CAPTURES, JOBS, QUERIES, REGISTRY, SCANS, SETTINGS, TRIGGERS
from .routes.keys import MODULES
from .jobs.modules import ModuleManager
from .routes.modules import add_module_routes
from .routes.keys import MEMORY
from .jobs.memory import MemoryManager
from .routes.memory import add_memory_routes
from .routes.metrics import CAPTURE_METRICS, METRICS_REGISTRY, PUSH_LISTENERS, add_metrics_routes
from .openapi import OPENAPI_PATH, openapi_json
from .routes.pages import add_page_routes, unauthorized_page
from .jobs.params import ParamError
from .routes.probe_channel import add_probe_channel
from .channel.registry import ProbeRegistry
from .jobs.request_captures import RequestCaptures
from .routes.keys import REQUEST_CAPTURES
from .routes.responses import JSON, http_exception_json, json_error
from .routes.scans import add_scan_routes
from .jobs.scans import ScanManager
from .routes.settings import ServiceSettings
from .metrics.sync_findings import SyncFindings, WatchCollector
from .routes.triggers import add_trigger_routes
from .incidents.triggers import Triggers
from .routes.alerts import ALERTS, add_alert_routes
from .incidents.alert_actions import OwnServer
from .incidents.alerts import Alerts
from .jobs.storing import JobStore, recorder_upload
from .routes.keys import STORE
from .store.client import open_store
from .store.counters import StoreCounters
from .store.layout import StoreLayout
from .store.reader import StoreReader
from .store.uploads import Uploader

__all__ = ["ServiceSettings", "make_app"]

log = logging.getLogger(__name__)

# Paths the HTTP token does not guard: the health check needs none; the probe channel and the
# metrics push never carry the token: their handlers check a proof of it (an HMAC, sidecar/common/auth.py).
_OPEN_PATHS = ("/healthz", PROBE_WS_PATH, METRICS_PUSH_PATH)


@web.middleware
async def errors_and_auth(request: web.Request, handler):
    """The token check, and every error a view raises as JSON of the one shape (docs/api.md)."""
    token = request.app[SETTINGS].http_token
    if token and request.path not in _OPEN_PATHS:
        if not auth.bearer_matches(request.headers.get("Authorization"), token):
            # A browser opening a page gets a form that asks for the token (routes/pages.py); others the JSON.
            return unauthorized_page(request) or json_error(
                401, "unauthorized", "a valid 'Authorization: Bearer <token>' header is required")
    try:
        return await handler(request)
    except ParamError as exc:
        return web.json_response(exc.to_json(), status=400)
    except web.HTTPException as exc:
        # Views raise aiohttp's exceptions with text= (HTTPNotFound(text=...)); the router raises them bare.
        if exc.status < 400 or exc.content_type == JSON:
            raise
        return http_exception_json(exc)
    except ConnectionError:
        raise  # the client left: nobody to answer
    except Exception:
        if request.writer.output_size:  # a response (a websocket) began: another cannot follow it
            raise
        log.exception("%s %s failed", request.method, request.path)
        return json_error(500, "internal_server_error", "the sidecar failed on this request; its log says why")


async def healthz(request: web.Request) -> web.Response:
    """The sidecar is up (200 whatever the engine does); ``stuck`` lists the engine processes whose
    step watchdog fires (SIDECAR_WATCHDOG_S), so a probe of liveness can see a hung engine too."""
    active = request.app[CAPTURES].active
    conns = request.app[REGISTRY].all()
    return web.json_response({
        "status": "ok", "version": __version__, "processes": len(conns),
        "active_capture": active.id if active else None,
        "stuck": [s for c in conns if (s := c.stuck_json()) is not None],
    })


def _job_store(settings: ServiceSettings, counters: StoreCounters) -> JobStore | None:
    """The object store of ``sidecar serve --store`` (None without one); ValueError for a URL the
    library refuses. No credential is read here: the library's chain finds them when it needs them."""
    if not settings.store_url:
        return None
    store = open_store(settings.store_url)
    uploader = Uploader(store, counters, max_pending=settings.store_queue, retry_for_s=settings.store_retry_for_s,
                        backoff_s=settings.store_backoff_s)
    layout = StoreLayout(settings.store_url, settings.store_instance or socket.gethostname())
    log.info("store: results are uploaded to %s (this sidecar: %s)", layout.url, layout.instance)
    return JobStore(uploader, StoreReader(store, counters), layout, retention=settings.store_retention)


def make_app(settings: ServiceSettings) -> web.Application:
    # The browser guard first: a cross-site or rebinding request is refused before the token is looked at.
    app = web.Application(middlewares=[browser_guard, errors_and_auth])
    settings.trace_dir.mkdir(parents=True, exist_ok=True)
    # One Prometheus target for every engine process: probes push OTLP metrics, /metrics serves them.
    add_metrics_routes(app, push_token=settings.probe_token)
    registry, board = ProbeRegistry(), JobBoard()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sidecar-export", initializer=merge.lower_priority)
    capture_metrics = app[CAPTURE_METRICS]
    # The uploads' metrics are served with or without a store (docs/telemetry.md).
    job_store = _job_store(settings, StoreCounters(app[METRICS_REGISTRY]))
    if job_store is not None:
        app[STORE] = job_store

    def observe_capture(c: Capture) -> None:
        steps = sum(p.steps_recorded for p in c.processes)
        capture_metrics.observe(c.state, steps, c.trace_bytes, (c.finished_at or c.created_at) - c.created_at)

    app[SETTINGS] = settings
    app[REGISTRY] = registry
    app[JOBS] = board
    app[CAPTURES] = CaptureManager(
        registry, board, settings.trace_dir, executor, max_capture_bytes=settings.max_capture_bytes,
        keep=settings.keep, keep_bytes=settings.keep_bytes, min_free_bytes=settings.min_free_bytes, stop_grace_s=settings.stop_grace_s, on_finished=observe_capture,
        store=job_store,
    )
    app[METRICS_REGISTRY].register(WatchCollector(registry))
    app[METRICS_REGISTRY].register(EngineStateCollector(registry))
    # Requests that ask to be captured (X-Sidecar-Profile) reach it over the probe channel.
    app[REQUEST_CAPTURES] = RequestCaptures(app[CAPTURES], capture_metrics, max_steps=settings.max_steps)
    app[SCANS] = ScanManager(registry, board, settings.trace_dir / "scans", keep=settings.keep,
                             keep_bytes=settings.keep_bytes, stop_grace_s=settings.stop_grace_s, on_finished=SyncFindings(app[METRICS_REGISTRY]).observe,
                             store=job_store)

    # Module timing (jobs/modules.py): the third kind of job, on the same board.
    app[MODULES] = ModuleManager(registry, board, settings.trace_dir / "modules", keep=settings.keep,
                                 keep_bytes=settings.keep_bytes, stop_grace_s=settings.stop_grace_s, store=job_store)

    # Memory snapshots (jobs/memory.py): the fourth kind, on the same board; each raw snapshot at most
    # --max-capture-mb or DEFAULT_MEMORY_FILE_BYTES, whichever is smaller.
    app[MEMORY] = MemoryManager(registry, board, settings.trace_dir / "memory", keep=settings.keep,
                                keep_bytes=settings.keep_bytes, stop_grace_s=settings.stop_grace_s, store=job_store,
                                max_bytes=min(settings.max_capture_bytes, DEFAULT_MEMORY_FILE_BYTES))

    async def lifecycle(app: web.Application):
        listing = None
        if job_store is not None:  # uploads and the store's listing run in the background, never awaited by a request
            job_store.uploader.start()
            listing = asyncio.ensure_future(app[CAPTURES].list_stored())
        yield
        if listing is not None:
            listing.cancel()
            await asyncio.gather(listing, return_exceptions=True)
            await job_store.uploader.close()
        await app[TRIGGERS].close()
        await app[ALERTS].close()
        await app[REQUEST_CAPTURES].close()
        await board.close()
        for ws in [c.ws for c in registry.all()]:
            await ws.close()
        executor.shutdown(wait=False, cancel_futures=True)

    app.cleanup_ctx.append(lifecycle)
    add_capture_routes(app)
    add_diff_routes(app)
    add_scan_routes(app)
    add_module_routes(app)
    add_memory_routes(app)
    add_incident_routes(app)
    app.add_routes([web.get("/healthz", healthz)])
    # The API's OpenAPI document (docs/api.md, "OpenAPI"); behind the token like every endpoint but /healthz.
    app.router.add_get(OPENAPI_PATH, openapi_json)
    # The pages a person opens in a browser: the home page and a capture's report (docs/report.md).
    add_page_routes(app)
    add_probe_channel(app)
    # Triggers see each heartbeat and metrics push as it arrives (incidents/triggers.py).
    # Each recorder dump a firing saves is uploaded to the object store, where there is one.
    on_dump = ((lambda path: job_store.uploader.submit(recorder_upload(job_store, path)))
               if job_store is not None else None)
    triggers = Triggers(registry=registry, captures=app[CAPTURES], scans=app[SCANS], queries=app[QUERIES],
                        trace_dir=settings.trace_dir, metrics=app[METRICS_REGISTRY], on_dump=on_dump)
    for rule in settings.triggers:
        triggers.add(rule)
    app[TRIGGERS] = triggers
    app[PUSH_LISTENERS].append(triggers.observe_push)
    add_trigger_routes(app)
    # Alertmanager's alerts run the same firings (incidents/alerts.py), for the actions configured at start.
    app[ALERTS] = Alerts(settings.alert_actions, OwnServer.of_this_host(settings.alert_instances), registry=registry,
                         captures=app[CAPTURES], scans=app[SCANS], queries=app[QUERIES], trace_dir=settings.trace_dir,
                         metrics=app[METRICS_REGISTRY], on_dump=on_dump)
    add_alert_routes(app)
    return app
