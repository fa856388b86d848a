"""The uploads' own metrics in ``/metrics`` (docs/telemetry.md), registered whether or not a store is
set, so that a dashboard's queries and the docs' table hold for every sidecar; every series from 0."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

KINDS = ("capture", "scan", "modules", "recorder")
OUTCOMES = ("stored", "failed", "dropped")


class StoreCounters:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.uploads = Counter("sidecar_store_uploads", "Uploads to the object store ended, by kind of result and "
                               "outcome (stored, failed, dropped: the oldest pending one when the queue was full).",
                               ["kind", "outcome"], registry=registry)
        self.retries = Counter("sidecar_store_upload_retries", "Upload attempts that failed and were retried "
                               "(the store unreachable or answering 5xx).", registry=registry)
        self.bytes = Counter("sidecar_store_upload_bytes", "Bytes uploaded to the object store.", registry=registry)
        self.pending = Gauge("sidecar_store_uploads_pending", "Uploads waiting or in progress.", registry=registry)
        self.fetches = Counter("sidecar_store_fetches", "Files of a stored capture downloaded back on demand, by "
                               "outcome (fetched, failed).", ["outcome"], registry=registry)
        for kind in KINDS:
            for outcome in OUTCOMES:
                self.uploads.labels(kind=kind, outcome=outcome)
        for outcome in ("fetched", "failed"):
            self.fetches.labels(outcome=outcome)
