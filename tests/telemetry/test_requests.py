import time

from opentelemetry.trace import SpanKind, StatusCode

from sidecar.telemetry import ClockOffset, FinishedRequest, record_request
from sidecar.telemetry.instruments import TIME_TO_FIRST_TOKEN_BUCKETS
from sidecar.telemetry.requests import operation_from_request_id

from .helpers import in_memory_telemetry, metric_points

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN_ID = "00f067aa0ba902b7"


def _request(clock: ClockOffset, **overrides) -> FinishedRequest:
    """A request that arrived 2 s ago: 10 ms to reach the engine queue, 20 ms queued, 30 ms prefill,
    then 9 more tokens over 90 ms, seen by the server 1 ms after the engine produced the last one."""
    arrival = time.time() - 2.0
    mono = arrival - clock.wall_minus_monotonic  # the engine's clock reading at arrival
    values = dict(
        request_id="chatcmpl-abc", model="tiny", operation="chat", finish_reason="length",
        arrival_time=arrival, finished_time=arrival + 0.151,
        queued_ts=mono + 0.010, scheduled_ts=mono + 0.030, first_token_ts=mono + 0.060, last_token_ts=mono + 0.150,
        time_to_first_token=0.0605, input_tokens=12, output_tokens=10, max_tokens=10, temperature=0.7, top_p=0.9)
    values.update(overrides)
    return FinishedRequest(**values)


def _by_name(spans):
    return {s.name: s for s in spans}


def test_span_tree_names_links_attributes_and_engine_timestamps():
    telemetry, exporter, _ = in_memory_telemetry()
    clock = ClockOffset.measure()
    req = _request(clock)
    record_request(req, telemetry.tracer, telemetry.requests, clock)
    telemetry.span_processor.force_flush()
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"chat tiny", "queue", "prefill", "decode"}
    root = spans["chat tiny"]
    assert root.kind == SpanKind.SERVER and root.parent is None
    for name in ("queue", "prefill", "decode"):
        assert spans[name].parent.span_id == root.context.span_id
        assert spans[name].context.trace_id == root.context.trace_id
    attrs = root.attributes
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "tiny"
    assert attrs["gen_ai.request.max_tokens"] == 10
    assert attrs["gen_ai.request.temperature"] == 0.7
    assert attrs["gen_ai.request.top_p"] == 0.9
    assert attrs["gen_ai.usage.input_tokens"] == 12
    assert attrs["gen_ai.usage.output_tokens"] == 10
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert attrs["gen_ai.response.id"] == "chatcmpl-abc"
    assert attrs["gen_ai.response.time_to_first_chunk"] == 0.0605
    assert "error.type" not in attrs
    # Start and end times are the request's own timestamps, the engine's converted to wall clock.
    ms = 1e6
    assert root.start_time == round(req.arrival_time * 1e9)
    assert abs(root.end_time - root.start_time - 151 * ms) < 0.01 * ms
    assert abs(spans["queue"].start_time - root.start_time - 10 * ms) < 0.01 * ms
    assert abs(spans["queue"].end_time - spans["queue"].start_time - 20 * ms) < 0.01 * ms
    assert abs(spans["prefill"].end_time - spans["prefill"].start_time - 30 * ms) < 0.01 * ms
    assert spans["prefill"].start_time == spans["queue"].end_time
    assert spans["decode"].start_time == spans["prefill"].end_time
    assert abs(spans["decode"].end_time - spans["decode"].start_time - 90 * ms) < 0.01 * ms


def test_traceparent_makes_the_request_span_a_child_of_the_callers():
    telemetry, exporter, _ = in_memory_telemetry()
    clock = ClockOffset.measure()
    headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_SPAN_ID}-01"}
    record_request(_request(clock, trace_headers=headers), telemetry.tracer, telemetry.requests, clock)
    telemetry.span_processor.force_flush()
    root = _by_name(exporter.get_finished_spans())["chat tiny"]
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_SPAN_ID
    assert root.parent.is_remote


def test_engine_on_another_clock_is_anchored_to_the_last_token():
    telemetry, exporter, _ = in_memory_telemetry()
    clock = ClockOffset.measure()
    req = _request(clock)
    shifted = ClockOffset(clock.wall_minus_monotonic + 3600.0)  # as if the engine's clock had another origin
    record_request(req, telemetry.tracer, telemetry.requests, shifted)
    telemetry.span_processor.force_flush()
    spans = _by_name(exporter.get_finished_spans())
    root, decode = spans["chat tiny"], spans["decode"]
    assert decode.end_time == root.end_time  # last token pinned to when the server saw it
    assert abs(decode.end_time - decode.start_time - 90e6) < 1e4  # durations stay exact
    assert root.start_time <= spans["queue"].start_time


def test_aborted_request_sets_error_type_and_skips_success_only_metrics():
    telemetry, exporter, reader = in_memory_telemetry()
    clock = ClockOffset.measure()
    req = _request(clock, finish_reason="abort", scheduled_ts=0.0, first_token_ts=0.0, last_token_ts=0.0,
                   time_to_first_token=0.0, output_tokens=0)
    record_request(req, telemetry.tracer, telemetry.requests, clock)
    telemetry.span_processor.force_flush()
    spans = _by_name(exporter.get_finished_spans())
    assert set(spans) == {"chat tiny"}  # never scheduled: no queue end, no prefill, no decode
    root = spans["chat tiny"]
    assert root.attributes["error.type"] == "aborted"
    assert root.status.status_code == StatusCode.ERROR
    assert metric_points(reader, "gen_ai.server.time_to_first_token") == []
    [duration] = metric_points(reader, "gen_ai.server.request.duration")
    assert duration.count == 1 and duration.attributes["error.type"] == "aborted"


def test_metrics_counts_buckets_and_values():
    telemetry, _, reader = in_memory_telemetry()
    clock = ClockOffset.measure()
    for _ in range(3):
        record_request(_request(clock), telemetry.tracer, telemetry.requests, clock)
    [ttft] = metric_points(reader, "gen_ai.server.time_to_first_token")
    assert ttft.count == 3 and tuple(ttft.explicit_bounds) == TIME_TO_FIRST_TOKEN_BUCKETS
    assert abs(ttft.sum - 3 * 0.0605) < 1e-9
    [tpot] = metric_points(reader, "gen_ai.server.time_per_output_token")
    assert abs(tpot.sum / tpot.count - 0.010) < 1e-6  # 90 ms over 9 tokens after the first
    [queue] = metric_points(reader, "sidecar.request.queue_time")
    assert abs(queue.sum / queue.count - 0.020) < 1e-6
    [requests] = metric_points(reader, "sidecar.requests")
    assert requests.value == 3
    tokens = {p.attributes["gen_ai.token.type"]: p.value for p in metric_points(reader, "sidecar.tokens")}
    assert tokens == {"input": 36, "output": 30}
    for point in ttft, tpot, queue, requests:
        assert point.attributes["gen_ai.operation.name"] == "chat"
        assert point.attributes["gen_ai.request.model"] == "tiny"


def test_operation_names_follow_openai_request_ids():
    assert operation_from_request_id("chatcmpl-1") == "chat"
    assert operation_from_request_id("cmpl-1") == "text_completion"
    assert operation_from_request_id("embd-1") == "embeddings"
    assert operation_from_request_id("whatever") == "text_completion"
