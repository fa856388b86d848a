"""The latest metric points of every engine process that pushes to the sidecar, rendered on scrape.

So that series of different processes never collide, these resource attributes become labels on
every series (named as the OpenTelemetry Prometheus exporter's ``resource_attribute_filter`` names
them): ``service.name``, ``service.instance.id``, ``process.pid``, ``sidecar.process.role``,
``sidecar.process.rank``; every process also gets a ``target_info`` with all its resource
attributes. A process that has not pushed for ``stale_after_s`` is dropped. The translation of
names and points is ``otlp_translation.py``.

What one process pushes must never break the scrape for the others, so a series Prometheus could
not show is refused at push time (``ingest`` returns each ``Drop``), never stored: a name that does
not translate, an invalid label name, a malformed histogram, or a name another family already has
(one pushed by any live process, this store's ``target_info``, or one of the sidecar's own metrics,
``reserved``). ``MetricsStore.render`` writes the sidecar's own metrics first, then the pushed ones,
and skips (and logs) any family it cannot write or that would repeat a name, rather than failing
the scrape. ``render`` writes either exposition (``encoder``): the Prometheus text format, or
OpenMetrics, which also shows the histogram buckets' exemplars; the store keeps each bucket's latest
exemplar across pushes (``otlp_translation.keep_exemplars``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from prometheus_client import generate_latest
from prometheus_client.core import InfoMetricFamily, Metric

from .otlp_translation import (
    CONFLICTING_TYPE,
    INVALID_LABEL_NAME,
    UNSUPPORTED,
    Series,
    attributes,
    data_points,
    exposition_names,
    family,
    keep_exemplars,
    label_name,
    label_value,
    prometheus_name,
    scope_labels,
    series_of,
    series_problem,
    valid_label_name,
)

log = logging.getLogger(__name__)

DEFAULT_STALE_AFTER_S = 300.0
PROMOTED_RESOURCE_ATTRIBUTES = ("service.name", "service.instance.id", "process.pid", "sidecar.process.role",
                                "sidecar.process.rank")
TARGET_INFO = ("target", "info")  # the store's own family: one sample per process


@dataclass(frozen=True)
class Drop:
    """A pushed series that was not stored: why, the OTLP metric's name, and its data points."""

    reason: str
    metric: str
    points: int


@dataclass
class _Process:
    labels: dict[str, str]
    resource: dict[str, str]
    last_seen: float = 0.0
    series: dict[tuple, Series] = field(default_factory=dict)


class _Claims:
    """Which family owns each exposition name: the name's (family name, kind) with how many stored
    series give it. A series may join its own family, never take a name another family has."""

    def __init__(self, reserved: Iterable[str]) -> None:
        self._owners: dict[str, Counter] = {}
        for name in reserved:
            self._owners.setdefault(name, Counter())[("", "reserved")] += 1
        self.add(*TARGET_INFO)

    def conflicts(self, name: str, kind: str) -> bool:
        return any(owner != (name, kind) and n > 0
                   for exposed in exposition_names(name, kind) for owner, n in self._owners.get(exposed, {}).items())

    def add(self, name: str, kind: str, count: int = 1) -> None:
        for exposed in exposition_names(name, kind):
            self._owners.setdefault(exposed, Counter())[(name, kind)] += count


class MetricsStore:
    """The latest cumulative points of every pushing process (thread-safe; rendered on scrape)."""

    def __init__(self, stale_after_s: float = DEFAULT_STALE_AFTER_S) -> None:
        self._processes: dict[str, _Process] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self.stale_after_s = stale_after_s

    def ingest(self, request: ExportMetricsServiceRequest, now: float | None = None,
               reserved: Iterable[str] = ()) -> list[Drop]:
        """Store the series of ``request`` and return the ones refused (``reserved``: the exposition
        names of the sidecar's own metrics, which no pushed family may take)."""
        now = time.time() if now is None else now
        drops: list[Drop] = []
        with self._lock:
            self._expire(now)
            claims = _Claims(reserved)
            for proc in self._processes.values():
                for series in proc.series.values():
                    claims.add(prometheus_name(series), series.kind)
            for rm in request.resource_metrics:
                proc = self._process(attributes(rm.resource.attributes), drops)
                proc.last_seen = now
                pushed: set[tuple] = set()
                for sm in rm.scope_metrics:
                    scope = scope_labels(sm)
                    for metric in sm.metrics:
                        key = (sm.scope.name, sm.scope.version, metric.name)
                        # A later push replaces a series (or removes it, if the new one is refused);
                        # one metric twice in this push competes with itself: the first one's type stays.
                        previous = self._forget(proc, key, claims) if key not in pushed else None
                        series, reason = _checked(metric, scope)
                        if series is not None and claims.conflicts(prometheus_name(series), series.kind):
                            series, reason = None, CONFLICTING_TYPE
                        if series is None:
                            drops.append(Drop(reason, metric.name, data_points(metric)))
                            continue
                        self._forget(proc, key, claims)
                        if previous is not None:
                            keep_exemplars(previous, series)
                        proc.series[key] = series
                        claims.add(prometheus_name(series), series.kind)
                        pushed.add(key)
        return drops

    @staticmethod
    def _forget(proc: _Process, key: tuple, claims: _Claims) -> Series | None:
        old = proc.series.pop(key, None)
        if old is not None:
            claims.add(prometheus_name(old), old.kind, -1)
        return old

    def _process(self, resource: dict, drops: list[Drop]) -> _Process:
        key = str(resource.get("service.instance.id") or (resource.get("host.name"), resource.get("process.pid")))
        proc = self._processes.get(key)
        if proc is None:
            labels = {label_name(k): label_value(resource[k]) for k in PROMOTED_RESOURCE_ATTRIBUTES if k in resource}
            info = {}
            for k, v in resource.items():  # target_info's labels: an attribute with no valid name is left out
                if valid_label_name(label_name(k)):
                    info[label_name(k)] = label_value(v)
                else:
                    drops.append(Drop(INVALID_LABEL_NAME, f"resource attribute {k!r}", 0))
            proc = self._processes[key] = _Process(labels, info)
        return proc

    def _expire(self, now: float) -> None:
        for key in [k for k, p in self._processes.items() if now - p.last_seen > self.stale_after_s]:
            del self._processes[key]

    def processes(self) -> int:
        return len(self._processes)

    def families(self, now: float | None = None) -> list[Metric]:
        """The pushed families; one that cannot be built is left out and logged."""
        now = time.time() if now is None else now
        with self._lock:
            self._expire(now)
            procs = list(self._processes.values())
        grouped: dict[tuple[str, str], list] = {}  # (family name, kind) → [first series, rows with full labels]
        for proc in procs:
            for series in proc.series.values():
                try:
                    name = prometheus_name(series)
                except ValueError as exc:
                    self._skipped(series.name, exc)
                    continue
                entry = grouped.setdefault((name, series.kind), [series, []])
                for row in series.points:
                    entry[1].append(({**proc.labels, **series.scope_labels, **row[0]},) + tuple(row[1:]))
        out: list[Metric] = []
        if procs:
            keys = sorted({k for p in procs for k in p.resource})
            info = InfoMetricFamily(TARGET_INFO[0], "Target metadata", labels=keys)
            for proc in procs:
                info.add_metric([], {k: proc.resource.get(k, "") for k in keys})
            out.append(info)
        for (name, kind), (first, rows) in sorted(grouped.items()):
            try:
                out.append(family(first.name, kind, first, rows))
            except Exception as exc:  # validated at push: a bug here must cost one family, not the scrape
                self._skipped(name, exc)
        return out

    def render(self, own, encoder: Callable[[object], bytes] = generate_latest) -> bytes:
        """The scrape: ``own`` (the sidecar's registry) first, so that a pushed family never shadows one
        of the sidecar's, then the pushed families; one that would repeat a name, or that cannot be
        written, is skipped. ``encoder``: prometheus_client's exposition, the text format's
        ``generate_latest`` or OpenMetrics' (each family alone, then OpenMetrics' one ``# EOF``)."""
        end = encoder(_One(None))  # what the format writes after the last family: "# EOF" in OpenMetrics
        out, emitted = [], set()
        for metric in [*_collected(own, "the sidecar's metrics"), *_collected(self, "pushed metrics")]:
            names = _exposed(metric)
            if names & emitted:
                self._skipped(metric.name, "a family of that name is already in this scrape")
                continue
            try:
                text = encoder(_One(metric))
            except Exception as exc:
                self._skipped(metric.name, exc)
                continue
            out.append(text[:len(text) - len(end)] if end and text.endswith(end) else text)
            emitted |= names
        return b"".join(out) + end

    def collect(self) -> list[Metric]:
        return self.families()

    def _skipped(self, name: str, why: object) -> None:
        # Once per name at warning: the same family fails again at every scrape.
        level = logging.DEBUG if name in self._warned else logging.WARNING
        self._warned.add(name)
        log.log(level, "metrics: family %s left out of /metrics: %s", name, why)


def _checked(metric, scope: dict[str, str]) -> tuple[Series | None, str]:
    try:
        series = series_of(metric, scope)
    except Exception:  # a shape translation does not foresee: that series only, not the push
        log.debug("metrics: cannot translate %r", metric.name, exc_info=True)
        return None, UNSUPPORTED
    if series is None:
        return None, UNSUPPORTED
    reason = series_problem(series)
    return (None, reason) if reason else (series, "")


def exposed_names(collector) -> set[str]:
    """Every exposition name ``collector``'s families take (the sidecar's own: ``ingest``'s ``reserved``)."""
    return {name for metric in _collected(collector, "the sidecar's metrics") for name in _exposed(metric)}


def _exposed(metric: Metric) -> set[str]:
    return exposition_names(metric.name, metric.type) | {s.name for s in metric.samples}


def _collected(collector, source: str) -> Iterator[Metric]:
    """``collector``'s families until one fails to collect (logged): the ones before it still count."""
    try:
        yield from collector.collect()
    except Exception:
        log.warning("metrics: collecting %s failed; its remaining families are left out", source, exc_info=True)


class _One:
    """One family as a collector (None: none): an exposition writes it, or fails for it alone."""

    def __init__(self, metric: Metric | None) -> None:
        self._metric = metric

    def collect(self) -> list[Metric]:
        return [] if self._metric is None else [self._metric]
