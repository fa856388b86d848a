"""A percentile of a pushed histogram over a recent window, for the triggers' percentile rules.

The probes push cumulative OTLP histograms every few seconds (docs/telemetry.md). The events of the
last ``window_s`` are the difference of two cumulative pushes of a series, bucket by bucket, as
Prometheus' ``increase()``; summed over every series of the metric (processes, attributes) and read
like ``histogram_quantile``: linear interpolation within the bucket the rank falls in, the highest
finite bound when it falls in the +Inf bucket.

Each series keeps its pushes of the longest window (a bounded list), so this holds a few hundred
rows per series at most. The baseline of a window is the newest push at or before its start; a series
whose process started inside the window counts from zero at that start; else, when the sidecar has not
seen a push that old (it started recently), the oldest push it has: a shorter window, never a count
of the whole life of a process. A count that went down is a restarted series: it counts from zero.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Iterable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

CUMULATIVE = 2  # AggregationTemporality.AGGREGATION_TEMPORALITY_CUMULATIVE
UNIT_TO_MS = {"s": 1000.0, "ms": 1.0, "us": 0.001}
MAX_POINTS = 1000  # per series: an hour of pushes every 5 s is 720


@dataclass
class _Series:
    start: float  # unix seconds the cumulative counts started from
    unit_ms: float
    bounds: tuple[float, ...]
    times: list[float] = field(default_factory=list)
    counts: list[tuple[int, ...]] = field(default_factory=list)


@dataclass(frozen=True)
class WindowValue:
    value_ms: float | None  # None: no event in the window
    count: int


def quantile(q: float, upper_bounds: list[float], counts: list[float]) -> float | None:
    """``histogram_quantile``: ``q`` in [0, 1]; ``upper_bounds`` sorted, the last +Inf; ``counts`` per
    bucket (not cumulative). None when the buckets are empty."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    cumulative = 0.0
    for i, (upper, n) in enumerate(zip(upper_bounds, counts)):
        if n > 0 and cumulative + n >= rank:
            if upper == float("inf"):
                finite = [b for b in upper_bounds if b != float("inf")]
                return finite[-1] if finite else None
            lower = upper_bounds[i - 1] if i > 0 else min(0.0, upper)
            return lower + (upper - lower) * (rank - cumulative) / n
        cumulative += n
    return None


class HistogramWindows:
    """The recent pushes of the histograms named in ``metrics`` (OTLP names), per series."""

    def __init__(self, metrics: Iterable[str], keep_s: float) -> None:
        self._metrics = frozenset(metrics)
        self._keep_s = keep_s
        self._series: dict[str, dict[tuple, _Series]] = {name: {} for name in self._metrics}

    def add(self, message: ExportMetricsServiceRequest, now: float) -> bool:
        """Take the watched histograms of one push; True when it had any."""
        took = False
        for rm in message.resource_metrics:
            resource = tuple(sorted((a.key, str(a.value)) for a in rm.resource.attributes))
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name not in self._metrics or not metric.HasField("histogram"):
                        continue
                    if metric.histogram.aggregation_temporality != CUMULATIVE:
                        continue
                    unit_ms = UNIT_TO_MS.get(metric.unit, 1000.0)
                    for point in metric.histogram.data_points:
                        key = (resource, tuple(sorted((a.key, str(a.value)) for a in point.attributes)))
                        self._take(self._series[metric.name], key, point, unit_ms, now)
                        took = True
        self._expire(now)
        return took

    def _take(self, table: dict[tuple, _Series], key: tuple, point, unit_ms: float, now: float) -> None:
        bounds = tuple(point.explicit_bounds)
        counts = tuple(point.bucket_counts)
        if len(counts) != len(bounds) + 1:
            return  # malformed: OTLP has one more bucket than bounds
        series = table.get(key)
        if series is None or series.bounds != bounds or (series.counts and sum(counts) < sum(series.counts[-1])):
            start = point.start_time_unix_nano / 1e9 if point.start_time_unix_nano else now
            series = table[key] = _Series(start=start, unit_ms=unit_ms, bounds=bounds)
        series.times.append(now)
        series.counts.append(counts)
        cut = bisect_right(series.times, now - self._keep_s - 60)
        if cut or len(series.times) > MAX_POINTS:
            cut = max(cut, len(series.times) - MAX_POINTS)
            del series.times[:cut], series.counts[:cut]

    def _expire(self, now: float) -> None:
        for table in self._series.values():
            for key in [k for k, s in table.items() if s.times[-1] < now - self._keep_s]:
                del table[key]

    def percentile(self, metric: str, percentile: float, window_s: float, now: float) -> WindowValue:
        """The ``percentile`` (0-100) of ``metric``'s events of the last ``window_s``, in ms."""
        since = now - window_s
        merged: dict[float, float] = {}
        for series in self._series.get(metric, {}).values():
            if series.times[-1] < since:
                continue  # no push inside the window
            i = bisect_right(series.times, since) - 1
            if i >= 0:
                base = series.counts[i]
            elif series.start >= since:
                base = (0,) * len(series.counts[-1])
            else:
                base = series.counts[0]
            uppers = [b * series.unit_ms for b in series.bounds] + [float("inf")]
            for upper, new, old in zip(uppers, series.counts[-1], base):
                merged[upper] = merged.get(upper, 0) + max(0, new - old)
        bounds = sorted(merged)
        counts = [merged[b] for b in bounds]
        return WindowValue(quantile(percentile / 100.0, bounds, counts), int(sum(counts)))
