"""A capture as a span, linked to the request spans that were in flight while it recorded (docs/telemetry.md)."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping, Sequence

from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, Tracer

from ..engine import GENERIC, EngineProfile
from ..protocol import CaptureReport
from ..verdicts import FINAL
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
    # Not every backend shows links (Phoenix's REST API drops them): the count travels as an attribute.
    attrs["sidecar.capture.linked_requests"] = len(links)
    span = tracer.start_span(SPAN_CAPTURE, context=Context(), kind=SpanKind.INTERNAL, attributes=attrs,
                             links=links, start_time=to_ns(capture.started_at))
    if capture.error:
        span.set_attribute("error.type", "capture_failed")
        span.set_status(Status(StatusCode.ERROR, capture.error))
    span.end(to_ns(max(capture.ended_at, capture.started_at)))
    return span.get_span_context()


# -- the API server's side: one capture span per capture window -------------------------------------
FetchStatus = Callable[[str], Mapping[str, Any]]  # capture id -> the sidecar's GET /profile/{id} body


def record_from_status(capture_id: str, started_at: float, ended_at: float, status: Mapping[str, Any] | None,
                       base_url: str, window_state: str,
                       window_roles: Collection[str] = GENERIC.window_roles) -> CaptureRecord:
    """A CaptureRecord from the sidecar's final capture status (None: the sidecar did not answer).
    ``steps`` is the fewest recorded by a step-driven process: any not of ``window_roles``."""
    if not status:
        return CaptureRecord(capture_id, window_state, started_at, ended_at, steps=0, processes=0, bytes=0,
                             error="the sidecar's capture status could not be read")
    procs = status.get("processes") or []
    driven = [p.get("steps_recorded") or 0 for p in procs if p.get("role") not in window_roles]
    trace = status.get("trace")
    return CaptureRecord(
        capture_id=capture_id, state=str(status.get("state")), started_at=started_at, ended_at=ended_at,
        steps=min(driven) if driven else 0, processes=len(procs), bytes=int(status.get("trace_bytes") or 0),
        trace_url=f"{base_url.rstrip('/')}{trace}" if trace else None,
        error=status.get("reason") if status.get("state") == "failed" else None)


def _capture_report(msg: Any) -> tuple[str | None, str | None]:
    """(job id, state) of a ``sidecar.protocol.CaptureReport``; (None, None) for any other report."""
    if isinstance(msg, CaptureReport):
        return msg.job_id, msg.state
    return None, None


class CaptureSpans:
    """Turns the capture reports of the API server's probe into ``sidecar capture`` spans.

    The probe calls ``on_report(msg)`` with each capture report (``CaptureReport``) it sends to the
    sidecar. The window opens at ``capturing`` and closes at ``exporting`` (or ``failed``); at
    ``done`` / ``failed`` a daemon thread waits for the sidecar's final status (steps, processes,
    bytes, trace URL; the merge happens there) and emits the span, linked to every request in flight
    during the window. Its ``steps`` counts the profile's step-driven roles only. Nothing here runs
    on the event loop beyond a dict update.
    """

    def __init__(self, tracer: Tracer, in_flight, fetch_status: FetchStatus, base_url: str, *,
                 profile: EngineProfile = GENERIC, final_timeout_s: float = 120.0, poll_s: float = 0.5) -> None:
        self._tracer = tracer
        self._window_roles = profile.window_roles
        self._in_flight = in_flight
        self._fetch = fetch_status
        self._base_url = base_url
        self._timeout = final_timeout_s
        self._poll = poll_s
        self._windows: dict[str, list[float]] = {}  # capture id -> [start, end]
        self._threads: list[threading.Thread] = []

    def on_report(self, msg: Any) -> None:
        capture_id, state = _capture_report(msg)
        if not capture_id:
            return
        now = time.time()
        if state == "capturing":
            self._windows[capture_id] = [now, 0.0]
        elif state == "exporting":
            window = self._windows.get(capture_id)
            if window is not None:
                window[1] = now
        elif state in ("done", "failed"):
            window = self._windows.pop(capture_id, None)
            if window is None:  # failed before it recorded: no window, no span
                return
            start, end = window[0], window[1] or now
            links = self._in_flight.overlapping(start, end)
            thread = threading.Thread(target=self._emit, args=(capture_id, start, end, links, state),
                                      name="sidecar-capture-span", daemon=True)
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _emit(self, capture_id: str, start: float, end: float, links: Sequence[SpanContext], state: str) -> None:
        deadline = time.monotonic() + self._timeout
        status = None
        while time.monotonic() < deadline:
            try:
                status = self._fetch(capture_id)
            except Exception as exc:
                log.debug("capture %s: status not readable: %s", capture_id, exc)
                status = None
            if status and status.get("state") in FINAL:
                break
            time.sleep(self._poll)
        record = record_from_status(capture_id, start, end, status if status and status.get("state") in FINAL
                                    else None, self._base_url, state, self._window_roles)
        try:
            record_capture(record, self._tracer, links)
        except Exception:
            log.warning("inference-sidecar: capture span of %s not recorded", capture_id, exc_info=True)

    def join(self, timeout_s: float = 10.0) -> None:
        """Wait for pending capture spans (tests, shutdown)."""
        for thread in list(self._threads):
            thread.join(timeout_s)
