"""The sidecar's own metrics about its captures, in the same registry as the engines' pushed ones."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class CaptureMetrics:
    """The sidecar's own counters for captures (the CaptureManager calls ``observe``)."""

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
