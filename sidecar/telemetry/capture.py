"""A capture as a span, linked to the request spans that were in flight while it recorded (docs/telemetry.md).

A capture bound to a request (a request-scoped capture) also links to that request's span, with
``sidecar.link=captured_request`` instead of ``request_in_flight``, and names the request
(``sidecar.capture.request_id``): from the capture's span, the request's trace. A capture that a
trigger or an Alertmanager alert started names it (``sidecar.capture.trigger.*``,
``sidecar.capture.alert.*``), as the sidecar's verdict says (``Verdict.started_by``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, Tracer

from ..common.protocol import CaptureReport, StartedBy, Verdict
from .clock import to_ns

log = logging.getLogger(__name__)

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
    request_id: str | None = None  # the request a request-scoped capture is bound to
    started_by: StartedBy | None = None  # the trigger or alert that started it


@dataclass(frozen=True)
class BoundRequest:
    """The request a capture is bound to, and its span's ids (None: chosen by no telemetry)."""

    request_id: str
    span_context: SpanContext | None = None


def record_capture(capture: CaptureRecord, tracer: Tracer, in_flight: Sequence[SpanContext] = (),
                   captured: SpanContext | None = None) -> SpanContext:
    """``in_flight``: the requests in flight during the window; ``captured``: the span of the request
    the capture is bound to (linked once, as the captured request, even when it was in flight too)."""
    attrs = {
        "sidecar.capture.id": capture.capture_id,
        "sidecar.capture.state": capture.state,
        "sidecar.capture.steps": capture.steps,
        "sidecar.capture.processes": capture.processes,
        "sidecar.capture.bytes": capture.bytes,
    }
    if capture.trace_url:
        attrs["sidecar.capture.trace_url"] = capture.trace_url
    if capture.request_id:
        attrs["sidecar.capture.request_id"] = capture.request_id
    attrs.update(started_by_attributes(capture.started_by))
    links = []
    if captured is not None and captured.is_valid:
        links.append(Link(captured, {"sidecar.link": "captured_request"}))
    links += [Link(ctx, {"sidecar.link": "request_in_flight"}) for ctx in in_flight
              if ctx.is_valid and (captured is None or ctx.span_id != captured.span_id)]
    # Not every backend shows links (Phoenix's REST API drops them): the count travels as an attribute.
    attrs["sidecar.capture.linked_requests"] = len(links)
    span = tracer.start_span(SPAN_CAPTURE, context=Context(), kind=SpanKind.INTERNAL, attributes=attrs,
                             links=links, start_time=to_ns(capture.started_at))
    if capture.error:
        span.set_attribute("error.type", "capture_failed")
        span.set_status(Status(StatusCode.ERROR, capture.error))
    span.end(to_ns(max(capture.ended_at, capture.started_at)))
    return span.get_span_context()


def started_by_attributes(cause: StartedBy | None) -> dict[str, Any]:
    """The capture span's attributes naming the trigger or the alert that started it (none: a client)."""
    if cause is None:
        return {}
    if cause.kind == "trigger":
        return {"sidecar.capture.trigger.id": cause.id, "sidecar.capture.trigger.name": cause.name}
    attrs: dict[str, Any] = {"sidecar.capture.alert.name": cause.name, "sidecar.capture.alert.fingerprint": cause.id,
                             "sidecar.capture.alert.labels": [f"{k}={v}" for k, v in sorted(cause.labels.items())]}
    if cause.starts_at:
        attrs["sidecar.capture.alert.starts_at"] = cause.starts_at
    return attrs


# -- the API server's side: one capture span per capture window -------------------------------------
def record_from_verdict(capture_id: str, started_at: float, ended_at: float, verdict: Verdict | None,
                        base_url: str, window_state: str, request_id: str | None = None) -> CaptureRecord:
    """A CaptureRecord from the sidecar's ``Verdict`` (None: none came in time)."""
    if verdict is None:
        return CaptureRecord(capture_id, window_state, started_at, ended_at, steps=0, processes=0, bytes=0,
                             error="the sidecar sent no verdict for this capture", request_id=request_id)
    return CaptureRecord(
        capture_id=capture_id, state=verdict.state, started_at=started_at, ended_at=ended_at,
        steps=verdict.steps, processes=verdict.processes, bytes=verdict.trace_bytes,
        trace_url=f"{base_url.rstrip('/')}{verdict.trace}" if verdict.trace else None,
        error=verdict.reason if verdict.state == "failed" else None, request_id=request_id,
        started_by=verdict.started_by)


class CaptureSpans:
    """Turns the capture reports of the API server's probe into ``sidecar capture`` spans.

    The probe calls ``on_report(msg)`` with each capture report (``CaptureReport``) it sends to the
    sidecar and with each ``Verdict`` the sidecar sends it. The window opens at ``capturing`` and
    closes at ``exporting`` (or ``failed``); at ``done`` / ``failed`` a daemon thread waits for the
    capture's verdict (steps, processes, bytes, trace URL: the merge happens in the sidecar) and
    emits the span, linked to every request in flight during the window and to the request it is
    bound to (``bind_request``, told by the engine integration when it is). The verdict comes over the
    probe's authenticated channel: nothing here calls the sidecar's HTTP API, so the token never
    leaves the process. Nothing here runs on the event loop beyond a dict update.
    """

    def __init__(self, tracer: Tracer, in_flight, base_url: str, *, verdict_timeout_s: float = 120.0) -> None:
        self._tracer = tracer
        self._in_flight = in_flight
        self._base_url = base_url
        self._timeout = verdict_timeout_s
        self._windows: dict[str, list[float]] = {}  # capture id -> [start, end]
        self._arrived: dict[str, threading.Event] = {}  # capture id -> set when its verdict came
        self._verdicts: dict[str, Verdict] = {}
        self._bound: dict[str, BoundRequest] = {}  # capture id -> the request it captures
        self._threads: list[threading.Thread] = []

    def bind_request(self, capture_id: str, request: BoundRequest) -> None:
        """``capture_id`` captures ``request``: its span links to the request's (any thread)."""
        self._bound[capture_id] = request

    def on_report(self, msg: Any) -> None:
        if isinstance(msg, Verdict):
            arrived = self._arrived.get(msg.job_id)
            if arrived is not None:  # a capture this process recorded a window of
                self._verdicts[msg.job_id] = msg
                arrived.set()
            return
        if not isinstance(msg, CaptureReport):
            return
        capture_id, state, now = msg.job_id, msg.state, time.time()
        if state == "capturing":
            self._windows[capture_id] = [now, 0.0]
            self._arrived[capture_id] = threading.Event()
        elif state == "exporting":
            window = self._windows.get(capture_id)
            if window is not None:
                window[1] = now
        elif state in ("done", "failed"):
            window = self._windows.pop(capture_id, None)
            if window is None:  # failed before it recorded: no window, no span
                self._bound.pop(capture_id, None)
                return
            start, end = window[0], window[1] or now
            links = self._in_flight.overlapping(start, end)
            thread = threading.Thread(target=self._emit, args=(capture_id, start, end, links, state),
                                      name="sidecar-capture-span", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _emit(self, capture_id: str, start: float, end: float, links: Sequence[SpanContext], state: str) -> None:
        arrived = self._arrived.get(capture_id)
        if arrived is not None:
            arrived.wait(self._timeout)
        self._arrived.pop(capture_id, None)
        bound = self._bound.pop(capture_id, None)
        record = record_from_verdict(capture_id, start, end, self._verdicts.pop(capture_id, None),
                                     self._base_url, state, bound.request_id if bound else None)
        try:
            record_capture(record, self._tracer, links, bound.span_context if bound else None)
        except Exception:
            log.warning("inference-sidecar: capture span of %s not recorded", capture_id, exc_info=True)

    def join(self, timeout_s: float = 10.0) -> None:
        """Wait for pending capture spans (tests, shutdown)."""
        for thread in list(self._threads):
            thread.join(timeout_s)
