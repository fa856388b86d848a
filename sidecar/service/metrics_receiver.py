"""One Prometheus scrape target for every process of an engine instance: the HTTP routes.

Engine processes push their OpenTelemetry metrics here over OTLP/HTTP (protobuf, cumulative
temporality; ``sidecar.telemetry.push``): ``POST`` ``protocol.METRICS_PUSH_PATH`` (``/v1/metrics``).
``GET /metrics`` renders the latest points of every process in Prometheus text format, translated
the way the OpenTelemetry Prometheus exporter translates them (``otlp_translation.py``; scope labels
``otel_scope_*``; a ``target_info`` per process), each series labelled with its process
(``metrics_store.py``), followed by the sidecar's own metrics (``capture_metrics.py``).

The registry is per app (no global registry); the sidecar's own capture counters live in it too.
"""

from __future__ import annotations

import gzip
import io

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import auth
from ..protocol import METRICS_PUSH_PATH
from .capture_metrics import CaptureMetrics
from .metrics_store import DEFAULT_STALE_AFTER_S, MetricsStore, StoreCollector

__all__ = ["CAPTURE_METRICS", "METRICS_REGISTRY", "METRICS_STORE", "PUSH_TOKEN", "SCRAPE_PATH", "CaptureMetrics",
           "MetricsStore", "add_metrics_routes"]

SCRAPE_PATH = "/metrics"
MAX_BODY_BYTES = 16 << 20
PROTOBUF = "application/x-protobuf"  # OTLP/HTTP's binary encoding, both ways

METRICS_STORE = web.AppKey("metrics_store", MetricsStore)
METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)
CAPTURE_METRICS = web.AppKey("capture_metrics", CaptureMetrics)
PUSH_TOKEN = web.AppKey("metrics_push_token", str)


async def receive_metrics(request: web.Request) -> web.Response:
    token = request.app.get(PUSH_TOKEN)
    if token and not auth.bearer_matches(request.headers.get("Authorization"), token):
        return web.json_response({"error": "unauthorized", "message": "a valid bearer token is required"}, status=401)
    if request.content_type != PROTOBUF:
        return web.json_response({"error": "unsupported_media_type",
                                  "message": f"send OTLP/HTTP metrics as {PROTOBUF}"}, status=415)
    if (request.content_length or 0) > MAX_BODY_BYTES:
        return web.json_response({"error": "too_large", "message": f"body over {MAX_BODY_BYTES} bytes"}, status=413)
    body = await request.read()
    try:
        if request.headers.get("Content-Encoding", "").lower() == "gzip":
            with gzip.GzipFile(fileobj=io.BytesIO(body)) as fh:
                body = fh.read(MAX_BODY_BYTES + 1)
            if len(body) > MAX_BODY_BYTES:
                raise ValueError("decompressed body too large")
        message = ExportMetricsServiceRequest.FromString(body)
    except Exception as exc:
        return web.json_response({"error": "bad_request", "message": f"not an OTLP metrics request: {exc}"},
                                 status=400)
    request.app[METRICS_STORE].ingest(message)
    return web.Response(body=ExportMetricsServiceResponse().SerializeToString(), content_type=PROTOBUF)


async def scrape(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_metrics_routes(app: web.Application, *, push_token: str | None = None,
                       stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
    """Mount ``POST /v1/metrics`` and ``GET /metrics`` on ``app``; ``push_token`` guards the push route."""
    store = MetricsStore(stale_after_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    app[METRICS_STORE] = store
    app[METRICS_REGISTRY] = registry
    app[CAPTURE_METRICS] = CaptureMetrics(registry)
    if push_token:
        app[PUSH_TOKEN] = push_token
    app.router.add_post(METRICS_PUSH_PATH, receive_metrics)
    app.router.add_get(SCRAPE_PATH, scrape)
