"""Hand-built OTLP metric pushes for the receiver's tests: a few metrics of any shape, including the
shapes a well-behaved SDK never sends, and the signature docs/api.md specifies."""

from __future__ import annotations

import hashlib
import hmac
import time

from aiohttp import web
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (
    AGGREGATION_TEMPORALITY_CUMULATIVE,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from prometheus_client.parser import text_string_to_metric_families

from sidecar.service.routes.metrics import add_metrics_routes

TOKEN = "s3cret"
PUSH = "/v1/metrics"


def app(**kwargs) -> web.Application:
    application = web.Application()
    add_metrics_routes(application, push_token=TOKEN, **kwargs)
    return application


def _attrs(attrs: dict | None) -> list[KeyValue]:
    return [KeyValue(key=k, value=AnyValue(string_value=str(v))) for k, v in (attrs or {}).items()]


def gauge(name: str, value: float = 1.0, unit: str = "", attrs: dict | None = None) -> Metric:
    return Metric(name=name, unit=unit, gauge=Gauge(data_points=[NumberDataPoint(as_double=value, attributes=_attrs(attrs))]))


def counter(name: str, value: int = 1, unit: str = "", attrs: dict | None = None) -> Metric:
    return Metric(name=name, unit=unit, sum=Sum(
        is_monotonic=True, aggregation_temporality=AGGREGATION_TEMPORALITY_CUMULATIVE,
        data_points=[NumberDataPoint(as_int=value, attributes=_attrs(attrs))]))


def histogram(name: str, bounds: list[float], counts: list[int], attrs: dict | None = None) -> Metric:
    point = HistogramDataPoint(explicit_bounds=bounds, bucket_counts=counts, count=sum(counts), sum=1.0,
                               attributes=_attrs(attrs))
    return Metric(name=name, histogram=Histogram(aggregation_temporality=AGGREGATION_TEMPORALITY_CUMULATIVE,
                                                 data_points=[point]))


def request(pid: int, *metrics: Metric, resource: dict | None = None) -> ExportMetricsServiceRequest:
    resource = {"service.name": "vllm", "service.instance.id": f"id-{pid}", "process.pid": str(pid), **(resource or {})}
    return ExportMetricsServiceRequest(resource_metrics=[ResourceMetrics(
        resource=Resource(attributes=_attrs(resource)),
        scope_metrics=[ScopeMetrics(metrics=list(metrics))])])


def signed(body: bytes, token: str = TOKEN, **headers: str) -> dict:
    """The headers of a signed push as docs/api.md gives them: the HMAC covers the body's SHA-256
    with any Content-Encoding undone (pass ``body`` decoded)."""
    ts = str(int(time.time()))
    digest = hashlib.sha256(body).hexdigest()
    signature = hmac.new(token.encode(), b"metrics\0" + ts.encode() + b"\0" + digest.encode(), hashlib.sha256).hexdigest()
    return {"X-Sidecar-Timestamp": ts, "X-Sidecar-Signature": signature, "Content-Type": "application/x-protobuf",
            **headers}


async def push(client, message: ExportMetricsServiceRequest):
    body = message.SerializeToString()
    return await client.post(PUSH, data=body, headers=signed(body))


def samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out
