"""OpenTelemetry metrics → Prometheus, as the OpenTelemetry Prometheus exporter translates them.

Names follow the exporter's ``_mapping.py`` (itself the specification's Prometheus compatibility
section and the collector's ``normalize_name.go``): ``gen_ai.server.time_to_first_token`` with unit
``s`` becomes ``gen_ai_server_time_to_first_token_seconds``; attribute keys become label names;
non-string attribute values are JSON. ``series_of`` turns one OTLP metric into one ``Series``
(cumulative sums, gauges and explicit-bucket histograms; anything else is refused as unsupported),
``series_problem`` says why Prometheus could not show one (the push is then refused for that series:
prometheus_client renders whatever it is given, and Prometheus refuses a whole scrape over one bad
line), and ``family`` renders rows of series into a ``prometheus_client`` metric family. The store
that keeps the latest series per process is ``store.py``.

A histogram point's exemplars become its buckets' exemplars, as the exporter makes them: labels
``trace_id`` and ``span_id`` (hex) when the exemplar has them, then its filtered attributes as labels
(the engine's ``request_id``); one per bucket, the latest. OpenMetrics allows an exemplar's label
names and values 128 characters in all (``EXEMPLAR_MAX_CHARS``; Prometheus refuses the scrape over a
longer one): the two ids always fit, and an attribute that would not is left out whole, never cut.
Only the OpenMetrics exposition shows exemplars; the exemplars of sums and gauges are not kept.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE
from prometheus_client.core import CounterMetricFamily, Exemplar, GaugeMetricFamily, HistogramMetricFamily, Metric

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
# Prometheus's own rules (its text parser's), stricter than prometheus_client's UTF-8 mode.
_PROMETHEUS_NAME_RE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_PROMETHEUS_LABEL_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_HAS_ALNUM_RE = re.compile(r"[a-zA-Z0-9]")

# Why a pushed series is not stored: the reason label of sidecar_metric_push_dropped_total.
INVALID_NAME = "invalid_name"  # nothing left of the name once translated ("", "_total", "...")
INVALID_LABEL_NAME = "invalid_label_name"  # empty (an attribute key ""), or "le" on a histogram
INVALID_HISTOGRAM = "invalid_histogram"  # bucket counts that do not fit the bounds, bounds not increasing
CONFLICTING_TYPE = "conflicting_type"  # a name another family already has (store.py)
UNSUPPORTED = "unsupported"  # delta temporality, exponential histograms, summaries
DROP_REASONS = (INVALID_NAME, INVALID_LABEL_NAME, INVALID_HISTOGRAM, CONFLICTING_TYPE, UNSUPPORTED)

EXEMPLAR_MAX_CHARS = 128  # OpenMetrics: an exemplar's label names and values together, in UTF-8 characters
TRACE_ID_LABEL, SPAN_ID_LABEL = "trace_id", "span_id"


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
    # [(labels, value)] or [(labels, bounds, bucket counts, sum, {bucket index: Exemplar})]
    points: list


def data_points(metric) -> int:
    kind = metric.WhichOneof("data")
    return len(getattr(metric, kind).data_points) if kind else 0


def series_of(metric, scope_labels: dict[str, str]) -> Series | None:
    """The series, or None for what Prometheus cannot show as the exporter does: delta temporality,
    exponential histograms, summaries."""
    kind = metric.WhichOneof("data")
    if kind == "gauge":
        family, points = GAUGE, metric.gauge.data_points
    elif kind == "sum":
        if metric.sum.aggregation_temporality != AGGREGATION_TEMPORALITY_CUMULATIVE:
            return None
        family, points = (COUNTER if metric.sum.is_monotonic else GAUGE), metric.sum.data_points
    elif kind == "histogram":
        if metric.histogram.aggregation_temporality != AGGREGATION_TEMPORALITY_CUMULATIVE:
            return None
        family, points = HISTOGRAM, metric.histogram.data_points
    else:
        return None
    rows = []
    for point in points:
        labels = {label_name(kv.key): label_value(any_value(kv.value)) for kv in point.attributes}
        if family == HISTOGRAM:
            # OTLP allows a point with no buckets at all (both lists empty): all of it is in +Inf.
            counts = list(point.bucket_counts) or ([] if point.explicit_bounds else [point.count])
            bounds = list(point.explicit_bounds)
            rows.append((labels, bounds, counts, point.sum, bucket_exemplars(point.exemplars, bounds)))
        else:
            rows.append((labels, point.as_double if point.WhichOneof("value") == "as_double" else point.as_int))
    return Series(family, metric_name(metric.name), metric.description, unit_suffix(metric.unit), scope_labels, rows)


def exemplar(otlp) -> Exemplar | None:
    """An OTLP exemplar as OpenMetrics shows one (see the module's docstring); None for a value that
    is not a finite number."""
    value = otlp.as_double if otlp.WhichOneof("value") == "as_double" else otlp.as_int
    if not math.isfinite(value):
        return None
    labels = {}
    if len(otlp.trace_id) == 16 and any(otlp.trace_id):  # W3C: 16 bytes, not all zero
        labels[TRACE_ID_LABEL] = otlp.trace_id.hex()
    if len(otlp.span_id) == 8 and any(otlp.span_id):
        labels[SPAN_ID_LABEL] = otlp.span_id.hex()
    size = sum(len(k) + len(v) for k, v in labels.items())
    for kv in otlp.filtered_attributes:
        name, text = label_name(kv.key), label_value(any_value(kv.value))
        if name in labels or not valid_label_name(name) or size + len(name) + len(text) > EXEMPLAR_MAX_CHARS:
            continue
        labels[name] = text
        size += len(name) + len(text)
    return Exemplar(labels, value, otlp.time_unix_nano / 1e9 if otlp.time_unix_nano else None)


def bucket_exemplars(exemplars, bounds: list[float]) -> dict[int, Exemplar]:
    """The latest exemplar of each bucket (an upper bound is its bucket's, as ``le``)."""
    out: dict[int, tuple[int, Exemplar]] = {}
    for otlp in exemplars:
        converted = exemplar(otlp)
        if converted is None:
            continue
        index = bisect.bisect_left(bounds, converted.value)
        if index not in out or otlp.time_unix_nano >= out[index][0]:
            out[index] = (otlp.time_unix_nano, converted)
    return {index: ex for index, (_, ex) in out.items()}


def keep_exemplars(previous: Series, series: Series) -> None:
    """``series`` replaces ``previous``: a bucket with no exemplar in it keeps the one it had (the SDK
    sends each exemplar once, in the push after its measurement; a scrape should still find it)."""
    if previous.kind != HISTOGRAM or series.kind != HISTOGRAM:
        return
    before = {_row_key(row): row for row in previous.points}
    for i, row in enumerate(series.points):
        old = before.get(_row_key(row))
        if old is not None and old[4] and old[1] == row[1]:
            series.points[i] = row[:4] + ({**old[4], **row[4]},)


def _row_key(row) -> tuple:
    return tuple(sorted(row[0].items()))


def prometheus_name(series: Series) -> str:
    """The family name ``family`` renders ``series`` under (prometheus_client drops a counter's
    ``_total``, adds the unit): the name that must be one family's only. ValueError: none."""
    return _FAMILIES[series.kind](series.name, "", unit=series.unit).name


def exposition_names(name: str, kind: str) -> set[str]:
    """Every name a family ``name`` of ``kind`` puts in an exposition (text or OpenMetrics): two
    families that share any of them make Prometheus refuse the scrape."""
    suffixes = {COUNTER: ("_total", "_created"), HISTOGRAM: ("_bucket", "_count", "_sum", "_created"),
                "summary": ("_count", "_sum", "_created"), "info": ("_info",)}.get(kind, ())
    return {name, *(name + suffix for suffix in suffixes)}


def valid_label_name(name: str) -> bool:
    return bool(_PROMETHEUS_LABEL_RE.match(name)) and not name.startswith("__")


def series_problem(series: Series) -> str | None:
    """Why Prometheus could not show ``series`` (a drop reason), or None."""
    base = series.name[:-len("_total")] if series.kind == COUNTER and series.name.endswith("_total") else series.name
    if not _HAS_ALNUM_RE.search(base):
        return INVALID_NAME
    try:
        name = prometheus_name(series)
    except ValueError:
        return INVALID_NAME
    if not _PROMETHEUS_NAME_RE.match(name):
        return INVALID_NAME
    for row in series.points:
        if not all(valid_label_name(k) and not (series.kind == HISTOGRAM and k == "le") for k in row[0]):
            return INVALID_LABEL_NAME
        if series.kind == HISTOGRAM and not _valid_buckets(row[1], row[2]):
            return INVALID_HISTOGRAM
    return None


def _valid_buckets(bounds: list[float], counts: list[int]) -> bool:
    """One count per bucket (the last is +Inf), finite bounds in increasing order: what a
    Prometheus histogram can say."""
    return (len(counts) == len(bounds) + 1 and all(math.isfinite(b) for b in bounds)
            and all(a < b for a, b in zip(bounds, bounds[1:])))


def family(name: str, kind: str, first: Series, rows: list) -> Metric:
    """The Prometheus family ``name`` of ``kind`` from rows of series (``first`` gives description
    and unit) whose label dicts already hold every label; a label a row lacks is empty."""
    keys = sorted({k for row in rows for k in row[0]})
    out = _FAMILIES[kind](name, first.description, labels=keys, unit=first.unit)
    for row in rows:
        values = [row[0].get(k, "") for k in keys]
        if kind == HISTOGRAM:
            _, bounds, counts, total, exemplars = row
            buckets, running = [], 0
            for i, (bound, count) in enumerate(zip([*bounds, "+Inf"], counts)):
                running += count
                ex = exemplars.get(i)
                buckets.append((f"{bound}", running, ex) if ex is not None else (f"{bound}", running))
            out.add_metric(values, buckets=buckets, sum_value=total)
        else:
            out.add_metric(values, row[1])
    return out
