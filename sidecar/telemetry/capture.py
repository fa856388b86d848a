"""A capture as a span, linked to the request spans that were in flight while it recorded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, Tracer

from .clock import to_ns

SPAN_CAPTURE = "sidecar capture"


@dataclass(frozen=True)
class CaptureRecord:
    capture_id: str
    state: str  # the capture's final state (done, failed, stopped, ...)
    started_at: float  # wall clock, s
    ended_at: float
    steps: int
    processes: int
    bytes: int
    trace_url: str | None = None
    error: str | None = None


def record_capture(capture: CaptureRecord, tracer: Tracer, in_flight: Sequence[SpanContext] = ()) -> SpanContext:
    attrs = {
        "sidecar.capture.id": capture.capture_id,
        "sidecar.capture.state": capture.state,
        "sidecar.capture.steps": capture.steps,
        "sidecar.capture.processes": capture.processes,
        "sidecar.capture.bytes": capture.bytes,
    }
    if capture.trace_url:
        attrs["sidecar.capture.trace_url"] = capture.trace_url
    links = [Link(ctx, {"sidecar.link": "request_in_flight"}) for ctx in in_flight if ctx.is_valid]
    span = tracer.start_span(SPAN_CAPTURE, context=Context(), kind=SpanKind.INTERNAL, attributes=attrs,
                             links=links, start_time=to_ns(capture.started_at))
    if capture.error:
        span.set_attribute("error.type", "capture_failed")
        span.set_status(Status(StatusCode.ERROR, capture.error))
    span.end(to_ns(max(capture.ended_at, capture.started_at)))
    return span.get_span_context()
