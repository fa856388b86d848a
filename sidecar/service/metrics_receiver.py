"""One Prometheus scrape target for every process of an engine instance.

Engine processes push their OpenTelemetry metrics here over OTLP/HTTP (protobuf, cumulative
temporality; ``sidecar.telemetry.push``): ``POST /v1/metrics``. ``GET /metrics`` renders the latest
points of every process in Prometheus text format, translated the way the OpenTelemetry Prometheus
exporter translates them (``gen_ai.server.time_to_first_token`` with unit ``s`` becomes
``gen_ai_server_time_to_first_token_seconds_bucket``; scope labels ``otel_scope_*``; a ``target_info``
per process). So that series of different processes never collide, these resource attributes become
labels on every series (named as the exporter's ``resource_attribute_filter`` names them):
``service.name``, ``service.instance.id``, ``process.pid``, ``sidecar.process.role``,
``sidecar.process.rank``. A process that has not pushed for ``stale_after_s`` is dropped.

The registry is per app (no global registry); the sidecar's own capture counters live in it too.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from .. import auth

PUSH_PATH = "/v1/metrics"
SCRAPE_PATH = "/metrics"
MAX_BODY_BYTES = 16 << 20
DEFAULT_STALE_AFTER_S = 300.0
PROMOTED_RESOURCE_ATTRIBUTES = ("service.name", "service.instance.id", "process.pid", "sidecar.process.role",
                                "sidecar.process.rank")

# -- name translation, as the OpenTelemetry Prometheus exporter does it (its _mapping.py, which follows
#    the specification's Prometheus compatibility section and the collector's normalize_name.go) ------
_UNIT_MAPPINGS = {
    "d": "days", "h": "hours", "min": "minutes", "s": "seconds", "ms": "milliseconds", "us": "microseconds",
    "ns": "nanoseconds", "By": "bytes", "KiBy": "kibibytes", "MiBy": "mebibytes", "GiBy": "gibibytes",
    "TiBy": "tibibytes", "KBy": "kilobytes", "MBy": "megabytes", "GBy": "gigabytes", "TBy": "terabytes",
    "m": "meters", "V": "volts", "A": "amperes", "J": "joules", "W": "watts", "g": "grams", "Cel": "celsius",
    "Hz": "hertz", "1": "", "%": "percent",
}
_PER_UNIT_MAPPINGS = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week", "mo": "month", "y": "year"}
_SANITIZE_NAME_RE = re.compile(r"[^a-zA-Z0-9:]+")
_SANITIZE_LABEL_RE = re.compile(r"[^a-zA-Z0-9]+")
_UNIT_ANNOTATION_RE = re.compile(r"{.*}")


def metric_name(name: str) -> str:
    if name and name[0].isdigit():
        name = "_" + name[1:]
    return _SANITIZE_NAME_RE.sub("_", name)


def label_name(key: str) -> str:
    if key and key[0].isdigit():
        key = "_" + key[1:]
    return _SANITIZE_LABEL_RE.sub("_", key)


def unit_suffix(unit: str) -> str:
    unit = _UNIT_ANNOTATION_RE.sub("", unit)
    if unit in _UNIT_MAPPINGS:
        return _UNIT_MAPPINGS[unit]
    parts = unit.split("/", maxsplit=1)
    if len(parts) == 2:
        bottom = _SANITIZE_NAME_RE.sub("_", parts[1])
        if bottom:
            top = _SANITIZE_NAME_RE.sub("_", parts[0])
            top = _UNIT_MAPPINGS.get(top, top)
            bottom = _PER_UNIT_MAPPINGS.get(bottom, bottom)
            return f"{top}_per_{bottom}" if top else f"per_{bottom}"
    return _SANITIZE_NAME_RE.sub("_", unit).strip("_")


def _any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind else ""


def _label_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _attributes(kvs) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


# -- the store --------------------------------------------------------------------------------------
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


@dataclass
class _Series:
    kind: str
    name: str
    description: str
    unit: str
    scope_labels: dict[str, str]
    points: list  # [(labels, value)] or [(labels, buckets, sum)]


@dataclass
class _Process:
    labels: dict[str, str]
    resource: dict[str, str]
    last_seen: float = 0.0
    series: dict[tuple, _Series] = field(default_factory=dict)


class MetricsStore:
    """The latest cumulative points of every pushing process (thread-safe; rendered on scrape)."""

    def __init__(self, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        self._processes: dict[str, _Process] = {}
        self._lock = threading.Lock()
        self.stale_after_s = stale_after_s
        self.skipped_points = 0  # delta temporality, exponential histograms, summaries

    def ingest(self, request: ExportMetricsServiceRequest, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self._lock:
            for rm in request.resource_metrics:
                resource = _attributes(rm.resource.attributes)
                key = str(resource.get("service.instance.id")
                          or (resource.get("host.name"), resource.get("process.pid")))
                proc = self._processes.get(key)
                if proc is None:
                    labels = {label_name(k): _label_value(resource[k]) for k in PROMOTED_RESOURCE_ATTRIBUTES
                              if k in resource}
                    proc = self._processes[key] = _Process(
                        labels, {label_name(k): _label_value(v) for k, v in resource.items()})
                proc.last_seen = now
                for sm in rm.scope_metrics:
                    scope_labels = {label_name("otel_scope_" + k): _label_value(v)
                                    for k, v in _attributes(sm.scope.attributes).items()}
                    scope_labels.update(otel_scope_name=sm.scope.name, otel_scope_version=sm.scope.version,
                                        otel_scope_schema_url=sm.schema_url)
                    for metric in sm.metrics:
                        series = self._series(metric, scope_labels)
                        if series is not None:
                            proc.series[(sm.scope.name, sm.scope.version, metric.name)] = series

    def _series(self, metric, scope_labels: dict[str, str]) -> _Series | None:
        kind = metric.WhichOneof("data")
        if kind == "gauge":
            family, points = GAUGE, metric.gauge.data_points
        elif kind == "sum":
            if metric.sum.aggregation_temporality != AGGREGATION_TEMPORALITY_CUMULATIVE:
                self.skipped_points += len(metric.sum.data_points)
                return None
            family, points = (COUNTER if metric.sum.is_monotonic else GAUGE), metric.sum.data_points
        elif kind == "histogram":
            if metric.histogram.aggregation_temporality != AGGREGATION_TEMPORALITY_CUMULATIVE:
                self.skipped_points += len(metric.histogram.data_points)
                return None
            family, points = HISTOGRAM, metric.histogram.data_points
        else:
            self.skipped_points += 1
            return None
        rows = []
        for point in points:
            labels = {label_name(kv.key): _label_value(_any_value(kv.value)) for kv in point.attributes}
            if family == HISTOGRAM:
                rows.append((labels, list(point.explicit_bounds), list(point.bucket_counts), point.sum))
            else:
                rows.append((labels, point.as_double if point.WhichOneof("value") == "as_double" else point.as_int))
        return _Series(family, metric_name(metric.name), metric.description, unit_suffix(metric.unit), scope_labels,
                       rows)

    def processes(self) -> int:
        return len(self._processes)

    def families(self, now: float | None = None) -> list[Metric]:
        now = time.time() if now is None else now
        with self._lock:
            for key in [k for k, p in self._processes.items() if now - p.last_seen > self.stale_after_s]:
                del self._processes[key]
            procs = list(self._processes.values())
        grouped: dict[tuple[str, str], list] = {}  # (name, kind) → [series, rows with full labels]
        for proc in procs:
            for series in proc.series.values():
                entry = grouped.setdefault((series.name, series.kind), [series, []])
                for row in series.points:
                    entry[1].append(({**proc.labels, **series.scope_labels, **row[0]},) + tuple(row[1:]))
        out: list[Metric] = []
        if procs:
            keys = sorted({k for p in procs for k in p.resource})
            info = InfoMetricFamily("target", "Target metadata", labels=keys)
            for proc in procs:
                info.add_metric([], {k: proc.resource.get(k, "") for k in keys})
            out.append(info)
        for (name, kind), (first, rows) in sorted(grouped.items()):
            keys = sorted({k for row in rows for k in row[0]})
            factory = {COUNTER: CounterMetricFamily, GAUGE: GaugeMetricFamily, HISTOGRAM: HistogramMetricFamily}[kind]
            family = factory(name, first.description, labels=keys, unit=first.unit)
            for row in rows:
                values = [row[0].get(k, "") for k in keys]
                if kind == HISTOGRAM:
                    _, bounds, counts, total = row
                    buckets, running = [], 0
                    for bound, count in zip([*bounds, "+Inf"], counts):
                        running += count
                        buckets.append((f"{bound}", running))
                    family.add_metric(values, buckets=buckets, sum_value=total)
                else:
                    family.add_metric(values, row[1])
            out.append(family)
        return out


class _StoreCollector:
    def __init__(self, store: MetricsStore) -> None:
        self._store = store

    def collect(self) -> Iterable[Metric]:
        return self._store.families()


class CaptureMetrics:
    """The sidecar's own counters for captures (the lead's CaptureManager calls ``observe``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.captures = Counter("sidecar_captures", "Captures finished, by final state.", ["state"], registry=registry)
        self.steps = Counter("sidecar_capture_steps", "Steps recorded by captures.", registry=registry)
        self.bytes = Counter("sidecar_capture_bytes", "Trace bytes written by captures.", registry=registry)
        self.duration = Histogram("sidecar_capture_duration_seconds", "Wall time of captures.", registry=registry,
                                  buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))

    def observe(self, state: str, steps: int, nbytes: int, duration_s: float) -> None:
        self.captures.labels(state=state).inc()
        self.steps.inc(max(steps, 0))
        self.bytes.inc(max(nbytes, 0))
        self.duration.observe(max(duration_s, 0.0))


METRICS_STORE = web.AppKey("metrics_store", MetricsStore)
METRICS_REGISTRY = web.AppKey("metrics_registry", CollectorRegistry)
CAPTURE_METRICS = web.AppKey("capture_metrics", CaptureMetrics)
PUSH_TOKEN = web.AppKey("metrics_push_token", str)


async def receive_metrics(request: web.Request) -> web.Response:
    token = request.app.get(PUSH_TOKEN)
    if token and not auth.bearer_matches(request.headers.get("Authorization"), token):
        return web.json_response({"error": "unauthorized", "message": "a valid bearer token is required"}, status=401)
    if request.content_type != "application/x-protobuf":
        return web.json_response({"error": "unsupported_media_type",
                                  "message": "send OTLP/HTTP metrics as application/x-protobuf"}, status=415)
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
    return web.Response(body=ExportMetricsServiceResponse().SerializeToString(), content_type="application/x-protobuf")


async def scrape(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS_REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def add_metrics_routes(app: web.Application, *, push_token: str | None = None,
                       stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
    """Mount ``POST /v1/metrics`` and ``GET /metrics`` on ``app``; ``push_token`` guards the push route."""
    store = MetricsStore(stale_after_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StoreCollector(store))
    app[METRICS_STORE] = store
    app[METRICS_REGISTRY] = registry
    app[CAPTURE_METRICS] = CaptureMetrics(registry)
    if push_token:
        app[PUSH_TOKEN] = push_token
    app.router.add_post(PUSH_PATH, receive_metrics)
    app.router.add_get(SCRAPE_PATH, scrape)
