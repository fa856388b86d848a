"""The sidecar's own metrics about its captures, in the same registry as the engines' pushed ones."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# Why a request that asked to be captured was served uncaptured (sidecar/service/jobs/request_captures.py).
SKIP_REASONS = ("busy", "no_engine_processes", "refused", "not_armed", "released")


class CaptureMetrics:
    """The sidecar's own counters for captures (the CaptureManager calls ``observe``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.captures = Counter("sidecar_captures", "Captures finished, by final state.", ["state"], registry=registry)
        self.steps = Counter("sidecar_capture_steps", "Steps recorded by captures.", registry=registry)
        self.bytes = Counter("sidecar_capture_bytes", "Trace bytes written by captures.", registry=registry)
        self.duration = Histogram("sidecar_capture_duration_seconds", "Wall time of captures.", registry=registry,
                                  buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
        self.request_captures = Counter(
            "sidecar_request_captures", "Requests that asked to be captured (X-Sidecar-Profile), by outcome "
            "(armed, skipped) and the reason a skipped one was served uncaptured.", ["outcome", "reason"],
            registry=registry)
        # Every series from 0, so that rate() and increase() have a start.
        self.request_captures.labels(outcome="armed", reason="none")
        for reason in SKIP_REASONS:
            self.request_captures.labels(outcome="skipped", reason=reason)

    def observe(self, state: str, steps: int, nbytes: int, duration_s: float) -> None:
        self.captures.labels(state=state).inc()
        self.steps.inc(max(steps, 0))
        self.bytes.inc(max(nbytes, 0))
        self.duration.observe(max(duration_s, 0.0))

    def observe_request_capture(self, skipped: str | None) -> None:
        """One request's ask answered: armed (``skipped`` None), or skipped for one of ``SKIP_REASONS``."""
        if skipped is None:
            self.request_captures.labels(outcome="armed", reason="none").inc()
        else:
            self.request_captures.labels(outcome="skipped", reason=skipped).inc()
