"""One Prometheus scrape target for every process of an engine instance: the HTTP routes.

Engine processes push their OpenTelemetry metrics here over OTLP/HTTP (protobuf, cumulative
temporality; ``sidecar.telemetry.push``): ``POST`` ``protocol.METRICS_PUSH_PATH`` (``/v1/metrics``).
``GET /metrics`` renders the sidecar's own metrics (``sidecar/service/metrics/captures.py``, sync findings), then the
latest points of every process in Prometheus text format, translated the way the OpenTelemetry
Prometheus exporter translates them (``sidecar/service/metrics/otlp_translation.py``; scope labels ``otel_scope_*``; a
``target_info`` per process), each series labelled with its process (``sidecar/service/metrics/store.py``).
A scraper that asks for OpenMetrics (``Accept: application/openmetrics-text``, as Prometheus does;
prometheus_client's ``choose_encoder`` negotiates) gets the same families in OpenMetrics instead,
with the exemplars of the histogram buckets (trace_id, span_id, request_id); the text format, which
cannot carry exemplars, stays the default and is served exactly as before.

Pushes are signed, not given the token (sidecar/common/auth.py): ``X-Sidecar-Timestamp`` (unix seconds,
within ``PUSH_MAX_SKEW_S`` of the sidecar's clock) and ``X-Sidecar-Signature`` (HMAC-SHA256 of the
timestamp and the SHA-256 of the body, its Content-Encoding undone). A push without a valid signature,
or one already received, is ``401`` JSON.

The body: OTLP/HTTP allows ``Content-Encoding: gzip``. aiohttp's HTTP parser already undoes it while
the body streams in (the server's ``auto_decompress``), so the route reads decoded bytes and must not
decode again: that is why the signature covers the decoded body. ``request.read()`` would stop at
the app's ``client_max_size`` (aiohttp's 1 MiB), so the route reads the stream with its own limit,
``MAX_BODY_BYTES``, stopping as soon as it is passed: a gzip bomb is never inflated past it.

A series Prometheus could not show is not stored (``sidecar/service/metrics/store.py``): each is counted in
``sidecar_metric_push_dropped_total{reason}`` and the push's answer says so in OTLP's own way, its
``partial_success`` (rejected data points, and which metrics why).

The registry (per app, no global one) holds the sidecar's own metrics, the store the pushed ones.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsPartialSuccess,
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import choose_encoder

from ...common import auth
from ...common.protocol import METRICS_PUSH_PATH
from ..metrics.captures import CaptureMetrics
from ..metrics.store import DEFAULT_STALE_AFTER_S, Drop, MetricsStore, exposed_names
from ..metrics.otlp_translation import DROP_REASONS
from .responses import json_error

__all__ = ["CAPTURE_METRICS", "METRICS_REGISTRY", "METRICS_STORE", "PUSH_LISTENERS", "PUSH_TOKEN", "SCRAPE_PATH", "CaptureMetrics",
           "MetricsStore", "add_metrics_routes"]

SCRAPE_PATH = "/metrics"
MAX_BODY_BYTES = 16 << 20  # docs/api.md: a push's body, its Content-Encoding undone
DECODED_ENCODINGS = ("", "identity", "gzip", "deflate")  # the ones aiohttp's parser undoes that HTTP pushes use
PROTOBUF = "application/x-protobuf"  # OTLP/HTTP's binary encoding, both ways
OPENMETRICS = "application/openmetrics-text"
MAX_NAMED_DROPS = 10  # in a partial_success message; the counter has them all

METRICS_STORE = web.AppKey("metrics_store", MetricsStore)
METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)
CAPTURE_METRICS = web.AppKey("capture_metrics", CaptureMetrics)
PUSH_TOKEN = web.AppKey("metrics_push_token", str)
PUSH_DROPS = web.AppKey("metrics_push_drops", Counter)
# Told of each push taken, with when it arrived (time.monotonic()): the triggers' percentile rules.
PushListener = Callable[[ExportMetricsServiceRequest, float], None]
PUSH_LISTENERS = web.AppKey("metrics_push_listeners", list)


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


class _BodyProblem(Exception):
    def __init__(self, response: web.Response) -> None:
        self.response = response


def _unauthorized(why: str) -> web.Response:
    return json_error(401, "unauthorized", f"a validly signed push is required: {why}")


def _too_large() -> _BodyProblem:
    return _BodyProblem(json_error(413, "too_large", f"a push body is at most {MAX_BODY_BYTES} bytes, "
                                   "its Content-Encoding undone: push more often, or fewer series"))


async def _read_body(request: web.Request, encoding: str) -> bytes:
    """The body as aiohttp's parser decoded it, at most MAX_BODY_BYTES (see the module's docstring)."""
    body = bytearray()
    try:
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise _too_large()
    except web.RequestPayloadError as exc:  # corrupt gzip, a broken chunked body: what the parser says
        what = f"valid {encoding} (Content-Encoding: {encoding})" if encoding not in ("", "identity") else "readable"
        raise _BodyProblem(json_error(400, "bad_request", f"the body is not {what}: {exc.__cause__ or exc}")) from None
    return bytes(body)


async def receive_metrics(request: web.Request) -> web.Response:
    arrived = time.monotonic()
    token = request.app.get(PUSH_TOKEN)
    now = time.time()
    stamp, signature = request.headers.get(auth.TIMESTAMP_HEADER), request.headers.get(auth.SIGNATURE_HEADER)
    if token:  # the checks that need no body first
        problem = auth.push_header_problem(stamp, signature, now)
        if problem is not None:
            return _unauthorized(problem)
    encoding = request.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in DECODED_ENCODINGS:  # aiohttp left it encoded: nothing here could read it
        return json_error(415, "unsupported_media_type", f"Content-Encoding {encoding!r}: send the body as is, "
                          "or gzip it")
    try:
        if (request.content_length or 0) > MAX_BODY_BYTES:
            raise _too_large()
        body = await _read_body(request, encoding)
    except _BodyProblem as problem:
        return problem.response
    if token:
        problem = auth.push_signature_problem(token, stamp, signature, body, now)
        if problem is None and not request.app[SEEN_SIGNATURES].add(signature, now):
            problem = "this push was received before (a replay)"
        if problem is not None:
            return _unauthorized(problem)
    if request.content_type != PROTOBUF:
        return json_error(415, "unsupported_media_type", f"send OTLP/HTTP metrics as {PROTOBUF}")
    try:
        message = ExportMetricsServiceRequest.FromString(body)
    except Exception as exc:
        return json_error(400, "bad_request", f"not an OTLP metrics request: {exc}")
    registry = request.app[METRICS_REGISTRY]
    drops = request.app[METRICS_STORE].ingest(message, reserved=exposed_names(registry))
    for drop in drops:
        request.app[PUSH_DROPS].labels(reason=drop.reason).inc()
    for listener in request.app[PUSH_LISTENERS]:
        listener(message, arrived)
    answer = ExportMetricsServiceResponse()
    if drops:  # OTLP's way to say "taken, but not all of it"
        answer.partial_success.CopyFrom(_partial_success(drops))
    return web.Response(body=answer.SerializeToString(), content_type=PROTOBUF)


def _partial_success(drops: list[Drop]) -> ExportMetricsPartialSuccess:
    named = "; ".join(f"{d.metric!r}: {d.reason}" for d in drops[:MAX_NAMED_DROPS])
    more = f"; and {len(drops) - MAX_NAMED_DROPS} more" if len(drops) > MAX_NAMED_DROPS else ""
    return ExportMetricsPartialSuccess(
        rejected_data_points=sum(d.points for d in drops),
        error_message=f"{len(drops)} series not stored (sidecar_metric_push_dropped_total on /metrics): {named}{more}")


def exposition(accept: str) -> tuple[Callable, str]:
    """(encoder, Content-Type) for a scrape's ``Accept``: OpenMetrics when it asks for it in a version
    prometheus_client writes, else the text format as the sidecar always served it."""
    encoder, content_type = choose_encoder(accept)
    if content_type.startswith(OPENMETRICS):
        return encoder, content_type
    return generate_latest, CONTENT_TYPE_LATEST


async def scrape(request: web.Request) -> web.Response:
    encoder, content_type = exposition(request.headers.get("Accept", ""))
    body = request.app[METRICS_STORE].render(request.app[METRICS_REGISTRY], encoder)
    return web.Response(body=body, headers={"Content-Type": content_type})


def add_metrics_routes(app: web.Application, *, push_token: str | None = None,
                       stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
    """Mount ``POST /v1/metrics`` and ``GET /metrics`` on ``app``; ``push_token`` guards the push route."""
    registry = CollectorRegistry(auto_describe=False)
    app[METRICS_STORE] = MetricsStore(stale_after_s)
    app[METRICS_REGISTRY] = registry
    app[CAPTURE_METRICS] = CaptureMetrics(registry)
    drops = Counter("sidecar_metric_push_dropped", "Pushed metric series not stored, by reason (the push's "
                    "OTLP partial_success names them).", ["reason"], registry=registry)
    for reason in DROP_REASONS:  # every reason from 0, so that rate() has a start
        drops.labels(reason=reason)
    app[PUSH_DROPS] = drops
    app[PUSH_LISTENERS] = []
    if push_token:
        app[PUSH_TOKEN] = push_token
        app[SEEN_SIGNATURES] = SeenSignatures()
    app.router.add_post(METRICS_PUSH_PATH, receive_metrics)
    app.router.add_get(SCRAPE_PATH, scrape)
