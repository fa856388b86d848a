"""Hidden-sync findings out of the sidecar: a Prometheus counter and an OpenTelemetry span per scan.

The counter ``sidecar_sync_site_hits_total{classification, op, phase, site}`` adds each site's hit
count when a scan finishes, so a dashboard can plot hidden syncs per scan over time. The span
``sync_scan`` carries one event per site (``sync_site``) with the site's attributes; it goes to
whatever TracerProvider the sidecar process has (none configured: a no-op).

The always-on watch (sidecar/syncs/watch.py) reports cumulative counts per process in the probes'
heartbeats; ``WatchCollector`` exposes them at scrape time as
``sidecar_sync_watch_calls_total{process, classification, op, phase, site}`` (a process that
restarts starts again from 0, which Prometheus reads as a counter reset).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Tracer
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import CounterMetricFamily

SPAN_NAME = "sync_scan"
EVENT_NAME = "sync_site"


class SyncFindings:
    def __init__(self, registry: CollectorRegistry, tracer: Tracer | None = None) -> None:
        self._hits = Counter(
            "sidecar_sync_site_hits", "Host-device synchronisations seen by sync scans, by site.",
            ["classification", "op", "phase", "site"], registry=registry,
        )
        self._scans = Counter("sidecar_sync_scans", "Sync scans finished, by final state.", ["state"], registry=registry)
        self._tracer = tracer or trace.get_tracer("inference-sidecar")

    def observe(self, scan: Any) -> None:
        self._scans.labels(state=scan.state).inc()
        for site in scan.sites:
            self._hits.labels(
                classification=site.get("classification", ""), op=site.get("op", ""),
                phase=site.get("phase", ""), site=f"{site.get('path') or site.get('file')}:{site.get('line')}",
            ).inc(site.get("count", 0))
        span = self._tracer.start_span(SPAN_NAME, start_time=int(scan.created_at * 1e9), attributes={
            "sidecar.sync.scan_id": scan.id, "sidecar.sync.state": scan.state, "sidecar.sync.steps": scan.request.steps,
            "sidecar.sync.hidden_sites": sum(1 for s in scan.sites if s.get("classification") == "hidden"),
        })
        for site in scan.sites:
            span.add_event(EVENT_NAME, {
                "code.filepath": str(site.get("path") or site.get("file")), "code.lineno": int(site.get("line") or 0),
                "code.function": str(site.get("function", "")), "sidecar.sync.op": str(site.get("op", "")),
                "sidecar.sync.phase": str(site.get("phase", "")),
                "sidecar.sync.classification": str(site.get("classification", "")),
                "sidecar.sync.count": int(site.get("count", 0)),
                "sidecar.sync.blocked_us": float(site.get("blocked_us", 0.0)),
            })
        span.end(int((scan.finished_at or scan.created_at) * 1e9))


class WatchCollector:
    """Reads the sync watch reports of the connected probes when Prometheus scrapes."""

    def __init__(self, probes: Any) -> None:
        self._probes = probes  # a ProbeRegistry

    def collect(self):
        family = CounterMetricFamily(
            "sidecar_sync_watch_calls", "Host-device synchronisations seen by the always-on sync watch (sampled steps), by site.",
            labels=["process", "classification", "op", "phase", "site"],
        )
        for conn in self._probes.all():
            report = conn.sync_watch or {}
            for site in report.get("sites", []):
                family.add_metric(
                    [conn.identity.label, str(site.get("classification", "")), str(site.get("op", "")),
                     str(site.get("phase", "")), f"{site.get('path') or site.get('file')}:{site.get('line')}"],
                    float(site.get("count", 0)),
                )
        yield family
