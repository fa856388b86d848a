"""One Prometheus scrape target for every process of an engine instance: the HTTP routes.

Engine processes push their OpenTelemetry metrics here over OTLP/HTTP (protobuf, cumulative
temporality; ``sidecar.telemetry.push``): ``POST`` ``protocol.METRICS_PUSH_PATH`` (``/v1/metrics``).
``GET /metrics`` renders the latest points of every process in Prometheus text format, translated
the way the OpenTelemetry Prometheus exporter translates them (``otlp_translation.py``; scope labels
``otel_scope_*``; a ``target_info`` per process), each series labelled with its process
(``metrics_store.py``), followed by the sidecar's own metrics (``capture_metrics.py``).

Pushes are signed, not given the token (sidecar/auth.py): ``X-Sidecar-Timestamp`` (unix seconds,
within ``PUSH_MAX_SKEW_S`` of the sidecar's clock) and ``X-Sidecar-Signature`` (HMAC-SHA256 of the
timestamp and the body's SHA-256). A push without a valid signature, or one already received, is
``401`` JSON.

The registry is per app (no global registry); the sidecar's own capture counters live in it too.
"""

from __future__ import annotations

import gzip
import io
import time
from collections import OrderedDict

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


class SeenSignatures:
    """Signatures of the pushes accepted in the last two skew windows: the same push twice is a
    replay. Only valid signatures enter, so its size follows the engine's own pushes."""

    MAX = 100_000

    def __init__(self, keep_s: float = 2 * auth.PUSH_MAX_SKEW_S) -> None:
        self._keep_s = keep_s
        self._seen: "OrderedDict[str, float]" = OrderedDict()

    def add(self, signature: str, now: float) -> bool:
        """False: seen before."""
        while self._seen and (next(iter(self._seen.values())) < now - self._keep_s or len(self._seen) >= self.MAX):
            self._seen.popitem(last=False)
        if signature in self._seen:
            return False
        self._seen[signature] = now
        return True


SEEN_SIGNATURES = web.AppKey("metrics_seen_signatures", SeenSignatures)


def _unauthorized(why: str) -> web.Response:
    return web.json_response({"error": "unauthorized", "message": f"a validly signed push is required: {why}"},
                             status=401)


async def receive_metrics(request: web.Request) -> web.Response:
    token = request.app.get(PUSH_TOKEN)
    now = time.time()
    stamp, signature = request.headers.get(auth.TIMESTAMP_HEADER), request.headers.get(auth.SIGNATURE_HEADER)
    if token:  # the checks that need no body first
        problem = auth.push_header_problem(stamp, signature, now)
        if problem is not None:
            return _unauthorized(problem)
    if (request.content_length or 0) > MAX_BODY_BYTES:
        return web.json_response({"error": "too_large", "message": f"body over {MAX_BODY_BYTES} bytes"}, status=413)
    body = await request.read()
    if token:
        problem = auth.push_signature_problem(token, stamp, signature, body, now)
        if problem is None and not request.app[SEEN_SIGNATURES].add(signature, now):
            problem = "this push was received before (a replay)"
        if problem is not None:
            return _unauthorized(problem)
    if request.content_type != PROTOBUF:
        return web.json_response({"error": "unsupported_media_type",
                                  "message": f"send OTLP/HTTP metrics as {PROTOBUF}"}, status=415)
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
        app[SEEN_SIGNATURES] = SeenSignatures()
    app.router.add_post(METRICS_PUSH_PATH, receive_metrics)
    app.router.add_get(SCRAPE_PATH, scrape)
