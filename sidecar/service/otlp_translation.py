"""OpenTelemetry metrics → Prometheus, as the OpenTelemetry Prometheus exporter translates them.

Names follow the exporter's ``_mapping.py`` (itself the specification's Prometheus compatibility
section and the collector's ``normalize_name.go``): ``gen_ai.server.time_to_first_token`` with unit
``s`` becomes ``gen_ai_server_time_to_first_token_seconds``; attribute keys become label names;
non-string attribute values are JSON. ``series_of`` turns one OTLP metric into one ``Series``
(cumulative sums, gauges and explicit-bucket histograms; anything else is skipped and counted), and
``family`` renders rows of series into a ``prometheus_client`` metric family. The store that keeps
the latest series per process is ``metrics_store.py``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

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


def any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    if kind == "bytes_value":
        return value.bytes_value.hex()
    return getattr(value, kind) if kind else ""


def label_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def attributes(kvs) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def scope_labels(scope_metrics) -> dict[str, str]:
    """The ``otel_scope_*`` labels of an OTLP ScopeMetrics: its attributes, name, version, schema URL."""
    labels = {label_name("otel_scope_" + k): label_value(v) for k, v in attributes(scope_metrics.scope.attributes).items()}
    labels.update(otel_scope_name=scope_metrics.scope.name, otel_scope_version=scope_metrics.scope.version,
                  otel_scope_schema_url=scope_metrics.schema_url)
    return labels


COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
_FAMILIES = {COUNTER: CounterMetricFamily, GAUGE: GaugeMetricFamily, HISTOGRAM: HistogramMetricFamily}


@dataclass
class Series:
    """One OTLP metric of one process, translated: the Prometheus family kind and name, and its points."""

    kind: str
    name: str
    description: str
    unit: str
    scope_labels: dict[str, str]
    points: list  # [(labels, value)] or [(labels, bounds, bucket counts, sum)]


def series_of(metric, scope_labels: dict[str, str]) -> tuple[Series | None, int]:
    """(the series, 0), or (None, points skipped) for what Prometheus cannot show as the exporter
    does: delta temporality, exponential histograms, summaries."""
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        family, points = GAUGE, metric.gauge.data_points
    elif kind == "sum":
        if metric.sum.aggregation_temporality != AGGREGATION_TEMPORALITY_CUMULATIVE:
            return None, len(metric.sum.data_points)
        family, points = (COUNTER if metric.sum.is_monotonic else GAUGE), metric.sum.data_points
    elif kind == "histogram":
        if metric.histogram.aggregation_temporality != AGGREGATION_TEMPORALITY_CUMULATIVE:
            return None, len(metric.histogram.data_points)
        family, points = HISTOGRAM, metric.histogram.data_points
    else:
        return None, 1
    rows = []
    for point in points:
        labels = {label_name(kv.key): label_value(any_value(kv.value)) for kv in point.attributes}
        if family == HISTOGRAM:
            rows.append((labels, list(point.explicit_bounds), list(point.bucket_counts), point.sum))
        else:
            rows.append((labels, point.as_double if point.WhichOneof("value") == "as_double" else point.as_int))
    return Series(family, metric_name(metric.name), metric.description, unit_suffix(metric.unit), scope_labels,
                  rows), 0


def family(name: str, kind: str, first: Series, rows: list) -> Metric:
    """The Prometheus family ``name`` of ``kind`` from rows of series (``first`` gives description
    and unit) whose label dicts already hold every label; a label a row lacks is empty."""
    keys = sorted({k for row in rows for k in row[0]})
    out = _FAMILIES[kind](name, first.description, labels=keys, unit=first.unit)
    for row in rows:
        values = [row[0].get(k, "") for k in keys]
        if kind == HISTOGRAM:
            _, bounds, counts, total = row
            buckets, running = [], 0
            for bound, count in zip([*bounds, "+Inf"], counts):
                running += count
                buckets.append((f"{bound}", running))
            out.add_metric(values, buckets=buckets, sum_value=total)
        else:
            out.add_metric(values, row[1])
    return out
