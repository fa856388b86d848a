"""Request span ids chosen on arrival, and capture spans linked to the requests in flight."""

import time

from opentelemetry.trace import SpanKind

from sidecar.common.protocol import CaptureReport, SyncReport, Verdict
from sidecar.telemetry import CaptureSpans, ClockOffset, FinishedRequest, InFlightRequests, record_request
from sidecar.telemetry.capture import record_from_verdict

from .helpers import in_memory_telemetry

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def _finished(request_id: str, ctx, headers=None) -> FinishedRequest:
    now = time.time()
    return FinishedRequest(request_id=request_id, model="tiny", operation="text_completion", finish_reason="stop",
                           arrival_time=now - 0.2, finished_time=now, input_tokens=3, output_tokens=2,
                           trace_headers=headers, span_context=ctx)


def test_request_span_takes_the_ids_chosen_on_arrival():
    telemetry, exporter, _ = in_memory_telemetry()
    in_flight = InFlightRequests()
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
    ctx_new = in_flight.begin("cmpl-a")
    ctx_child = in_flight.begin("cmpl-b", headers)
    assert ctx_child.trace_id == int(TRACE_ID, 16) and ctx_new.trace_id != ctx_child.trace_id
    clock = ClockOffset.measure()
    got_a = record_request(_finished("cmpl-a", ctx_new), telemetry.tracer, telemetry.requests, clock)
    got_b = record_request(_finished("cmpl-b", ctx_child, headers), telemetry.tracer, telemetry.requests, clock)
    assert (got_a.trace_id, got_a.span_id) == (ctx_new.trace_id, ctx_new.span_id)
    assert (got_b.trace_id, got_b.span_id) == (ctx_child.trace_id, ctx_child.span_id)
    # Without preset ids (and after them) spans get fresh random ids; child spans never reuse them.
    got_c = record_request(_finished("cmpl-c", None), telemetry.tracer, telemetry.requests, clock)
    telemetry.span_processor.force_flush()
    spans = exporter.get_finished_spans()
    assert len({s.context.span_id for s in spans}) == len(spans) == 3
    assert got_c.span_id not in (ctx_new.span_id, ctx_child.span_id)
    root_b = next(s for s in spans if s.context.span_id == ctx_child.span_id)
    assert root_b.parent.span_id == int(PARENT_ID, 16) and root_b.kind == SpanKind.SERVER
    telemetry.shutdown()


def test_overlapping_keeps_running_and_recently_finished_requests():
    in_flight = InFlightRequests(finished_capacity=2)
    b = in_flight.begin("b", now=8.0)
    a = in_flight.begin("a", now=10.0)
    c = in_flight.begin("c", now=12.0)
    in_flight.end("a", now=12.5)  # finished inside the window
    in_flight.end("b", now=10.5)  # finished before it
    d = in_flight.begin("d", now=20.0)  # arrived after it

    def ids(ctxs):
        return {ctx.span_id for ctx in ctxs}

    assert ids(in_flight.overlapping(12.0, 13.0)) == ids([a, c])
    assert ids(in_flight.overlapping(9.0, 30.0)) == ids([a, b, c, d])
    in_flight.end("c", now=14.0)
    in_flight.end("d", now=21.0)  # ring of 2: a and b are forgotten
    assert ids(in_flight.overlapping(0.0, 30.0)) == ids([c, d])
    assert len(in_flight) == 0


def test_capture_span_links_requests_in_flight_and_carries_the_sidecar_verdict():
    telemetry, exporter, _ = in_memory_telemetry()
    in_flight = InFlightRequests()
    before = in_flight.begin("cmpl-before")
    in_flight.end("cmpl-before")
    time.sleep(0.01)
    running = in_flight.begin("cmpl-running")
    captures = CaptureSpans(telemetry.tracer, in_flight, "http://127.0.0.1:8787")
    # The probe hands over the typed reports it sends (sidecar.common.protocol.CaptureReport) and the
    # verdicts the sidecar sends it.
    captures.on_report(CaptureReport(job_id="c1", state="capturing"))
    captures.on_report(SyncReport(job_id="c1", state="done"))  # not a capture report: ignored
    during = in_flight.begin("cmpl-during")
    in_flight.end("cmpl-during")
    captures.on_report(CaptureReport(job_id="c1", state="exporting"))
    in_flight.begin("cmpl-after")
    captures.on_report(CaptureReport(job_id="c1", state="done", bytes=10))
    captures.on_report(CaptureReport(job_id="c2", state="failed"))  # no window
    captures.on_report(Verdict(job_id="c2", state="failed", reason="x"))  # no window: no span
    captures.on_report(Verdict(job_id="c1", state="done", steps=5, processes=3, trace_bytes=12345,
                               trace="/profile/c1/trace"))
    captures.join()
    telemetry.span_processor.force_flush()
    (span,) = exporter.get_finished_spans()
    assert span.name == "sidecar capture"
    assert dict(span.attributes) == {
        "sidecar.capture.id": "c1", "sidecar.capture.state": "done", "sidecar.capture.steps": 5,
        "sidecar.capture.processes": 3, "sidecar.capture.linked_requests": 2, "sidecar.capture.bytes": 12345,
        "sidecar.capture.trace_url": "http://127.0.0.1:8787/profile/c1/trace"}
    assert {link.context.span_id for link in span.links} == {running.span_id, during.span_id}
    assert before.span_id not in {link.context.span_id for link in span.links}
    telemetry.shutdown()


def test_capture_span_without_a_verdict_says_so():
    telemetry, exporter, _ = in_memory_telemetry()
    captures = CaptureSpans(telemetry.tracer, InFlightRequests(), "http://x", verdict_timeout_s=0.05)
    captures.on_report(CaptureReport(job_id="c3", state="capturing"))
    captures.on_report(CaptureReport(job_id="c3", state="done"))
    captures.join()
    telemetry.span_processor.force_flush()
    (span,) = exporter.get_finished_spans()
    assert span.attributes["sidecar.capture.state"] == "done" and span.status.description == (
        "the sidecar sent no verdict for this capture")
    telemetry.shutdown()


def test_record_from_verdict_reports_failures_and_urls():
    failed = record_from_verdict("c", 0.0, 1.0, Verdict(job_id="c", state="failed", reason="no steps"), "http://x/", "done")
    assert failed.error == "no steps" and failed.trace_url is None
    done = record_from_verdict("c", 0.0, 1.0, Verdict(job_id="c", state="partial", reason="r", trace="/profile/c/trace"),
                               "http://x/", "done")
    assert done.error is None and done.trace_url == "http://x/profile/c/trace"


def test_a_request_spans_identity_lives_in_inflight_which_imports_nothing_of_requests():
    import ast
    from pathlib import Path

    import sidecar.telemetry.inflight as inflight

    tree = ast.parse(Path(inflight.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "requests" not in imported and not any((m or "").endswith(".requests") for m in imported)
    from sidecar.telemetry import requests

    assert requests.parent_context is inflight.parent_context
