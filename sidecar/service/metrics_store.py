"""The latest metric points of every engine process that pushes to the sidecar, rendered on scrape.

So that series of different processes never collide, these resource attributes become labels on
every series (named as the OpenTelemetry Prometheus exporter's ``resource_attribute_filter`` names
them): ``service.name``, ``service.instance.id``, ``process.pid``, ``sidecar.process.role``,
``sidecar.process.rank``; every process also gets a ``target_info`` with all its resource
attributes. A process that has not pushed for ``stale_after_s`` is dropped. The translation of
names and points is ``otlp_translation.py``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterable

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from prometheus_client.core import InfoMetricFamily, Metric

from .otlp_translation import Series, attributes, family, label_name, label_value, scope_labels, series_of

DEFAULT_STALE_AFTER_S = 300.0
PROMOTED_RESOURCE_ATTRIBUTES = ("service.name", "service.instance.id", "process.pid", "sidecar.process.role",
                                "sidecar.process.rank")


@dataclass
class _Process:
    labels: dict[str, str]
    resource: dict[str, str]
    last_seen: float = 0.0
    series: dict[tuple, Series] = field(default_factory=dict)


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
                resource = attributes(rm.resource.attributes)
                key = str(resource.get("service.instance.id")
                          or (resource.get("host.name"), resource.get("process.pid")))
                proc = self._processes.get(key)
                if proc is None:
                    labels = {label_name(k): label_value(resource[k]) for k in PROMOTED_RESOURCE_ATTRIBUTES
                              if k in resource}
                    proc = self._processes[key] = _Process(
                        labels, {label_name(k): label_value(v) for k, v in resource.items()})
                proc.last_seen = now
                for sm in rm.scope_metrics:
                    scope = scope_labels(sm)
                    for metric in sm.metrics:
                        series, skipped = series_of(metric, scope)
                        self.skipped_points += skipped
                        if series is not None:
                            proc.series[(sm.scope.name, sm.scope.version, metric.name)] = series

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
            out.append(family(name, kind, first, rows))
        return out


class StoreCollector:
    """A ``prometheus_client`` collector that renders a store at scrape time."""

    def __init__(self, store: MetricsStore) -> None:
        self._store = store

    def collect(self) -> Iterable[Metric]:
        return self._store.families()
