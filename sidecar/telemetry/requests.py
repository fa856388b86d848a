"""A finished request → one span tree and its metrics, with the engine's own timestamps.

``FinishedRequest`` is engine-agnostic; engine integrations (``plugins/sidecar_vllm/stat_logger.py``)
fill it from the engine's per-request stats and pass their profile's ``provider``. The request
span's identity (its parent from W3C headers, ids chosen on arrival) is inflight.py's.
``record_request`` makes

    {gen_ai.operation.name} {gen_ai.request.model}   (SERVER, arrival → last output seen)
      ├── queue     (engine: queued → first scheduled)
      ├── prefill   (engine: first scheduled → first token)
      └── decode    (engine: first token → last token; only with more than one output token)

and records the request metrics. Span and attribute names are a stable interface (docs/telemetry.md).

The four latency histograms are recorded in the request span's context: with the SDK's trace-based
exemplar filter (setup.py; ``OTEL_METRICS_EXEMPLAR_FILTER``), a sampled request span leaves an exemplar
with its trace and span ids, and with ``EXEMPLAR_REQUEST_ID`` its request id (instruments.py).

A request that asked to be captured (a request-scoped capture, docs/api.md) carries on its span the
capture's id and URL (``sidecar.capture.id``, ``sidecar.capture.url``), or why it was served
uncaptured (``sidecar.capture.skipped``): from the span, its trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode, Tracer

from ..engine import GENERIC
from .clock import ClockOffset, to_ns
from .inflight import PresetIdGenerator, parent_context
from .instruments import EXEMPLAR_REQUEST_ID, RequestInstruments

OPERATION_CHAT = "chat"
OPERATION_TEXT_COMPLETION = "text_completion"
OPERATION_EMBEDDINGS = "embeddings"

SPAN_QUEUE = "queue"
SPAN_PREFILL = "prefill"
SPAN_DECODE = "decode"

# error.type values this package reports (the conventions ask instrumentations to list them).
ERROR_ABORTED = "aborted"  # the client went away or the request was cancelled
ERROR_ENGINE = "engine_error"  # the engine ended the request with an error
_ERROR_BY_FINISH_REASON = {"abort": ERROR_ABORTED, "error": ERROR_ENGINE}

# Engine timestamps converted with the host clock offset may be off by this much and still be trusted.
CLOCK_TOLERANCE_S = 0.05


@dataclass(frozen=True)
class FinishedRequest:
    request_id: str
    model: str
    operation: str
    finish_reason: str  # lower case: stop, length, abort, error, ...
    arrival_time: float  # wall clock, s: the server received the request
    finished_time: float  # wall clock, s: the server saw the request's last output
    # Engine monotonic clock, s; 0.0 when the request never reached that point.
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    time_to_first_token: float = 0.0  # s, arrival → first token seen by the server; 0.0 when none
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    preemptions: int = 0
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    trace_headers: Mapping[str, str] | None = None  # incoming W3C traceparent / tracestate
    # The request span's ids, when they were chosen on arrival (InFlightRequests.begin) so that spans
    # emitted while the request ran (captures) could link to it.
    span_context: trace.SpanContext | None = None
    # A request that asked to be captured: its capture (id, URL on the sidecar), or why it has none.
    capture_id: str | None = None
    capture_url: str | None = None
    capture_skipped: str | None = None

    @property
    def error_type(self) -> str | None:
        return _ERROR_BY_FINISH_REASON.get(self.finish_reason)

    @property
    def span_name(self) -> str:
        return f"{self.operation} {self.model}"

    @property
    def time_per_output_token(self) -> float | None:
        """Mean decode time per token after the first (engine clock), as the conventions define it."""
        if self.output_tokens < 2 or not self.first_token_ts or not self.last_token_ts:
            return None
        return (self.last_token_ts - self.first_token_ts) / (self.output_tokens - 1)

    @property
    def queue_time(self) -> float | None:
        if not self.queued_ts or not self.scheduled_ts:
            return None
        return self.scheduled_ts - self.queued_ts


def operation_from_request_id(request_id: str, default: str = OPERATION_TEXT_COMPLETION) -> str:
    """OpenAI-compatible servers (vLLM's among them) prefix request ids by endpoint."""
    if request_id.startswith("chatcmpl-"):
        return OPERATION_CHAT
    if request_id.startswith("cmpl-"):
        return OPERATION_TEXT_COMPLETION
    if request_id.startswith("embd-"):
        return OPERATION_EMBEDDINGS
    return default


def _engine_clock(req: FinishedRequest, clock: ClockOffset) -> ClockOffset:
    """The host offset when it maps the engine's timestamps inside the request; else an anchored one."""
    stamps = [t for t in (req.queued_ts, req.scheduled_ts, req.first_token_ts, req.last_token_ts) if t]
    if not stamps:
        return clock
    lo, hi = req.arrival_time - CLOCK_TOLERANCE_S, req.finished_time + CLOCK_TOLERANCE_S
    if all(lo <= clock.to_wall(t) <= hi for t in stamps):
        return clock
    return ClockOffset.anchored(max(stamps), req.finished_time)


def _provider(provider: str) -> dict:
    # An engine without a profile of its own has no provider name: the attribute is left out rather
    # than sent empty.
    return {"gen_ai.provider.name": provider} if provider else {}


def request_attributes(req: FinishedRequest, provider: str) -> dict:
    attrs = {
        "gen_ai.operation.name": req.operation,
        **_provider(provider),
        "gen_ai.request.model": req.model,
        "gen_ai.response.model": req.model,
        "gen_ai.response.id": req.request_id,
        "gen_ai.response.finish_reasons": (req.finish_reason,),
        "gen_ai.usage.input_tokens": req.input_tokens,
        "gen_ai.usage.output_tokens": req.output_tokens,
    }
    if req.max_tokens is not None:
        attrs["gen_ai.request.max_tokens"] = req.max_tokens
    if req.temperature is not None:
        attrs["gen_ai.request.temperature"] = req.temperature
    if req.top_p is not None:
        attrs["gen_ai.request.top_p"] = req.top_p
    if req.cached_input_tokens:
        attrs["gen_ai.usage.cache_read.input_tokens"] = req.cached_input_tokens
    if req.time_to_first_token > 0:
        attrs["gen_ai.response.time_to_first_chunk"] = req.time_to_first_token
    if req.preemptions:
        attrs["sidecar.request.preemptions"] = req.preemptions
    if req.error_type:
        attrs["error.type"] = req.error_type
    if req.capture_id:
        attrs["sidecar.capture.id"] = req.capture_id
    if req.capture_url:
        attrs["sidecar.capture.url"] = req.capture_url
    if req.capture_skipped:
        attrs["sidecar.capture.skipped"] = req.capture_skipped
    return attrs


def record_request(
    req: FinishedRequest,
    tracer: Tracer,
    instruments: RequestInstruments | None,
    clock: ClockOffset,
    *,
    provider: str = GENERIC.provider,
    links: Sequence[Link] = (),
) -> trace.SpanContext:
    """Emit the span tree of one finished request and record its metrics; returns the request span's
    context. ``provider`` is ``gen_ai.provider.name``: the engine profile's ``provider``."""
    attrs = request_attributes(req, provider)
    start_ns, end_ns = to_ns(req.arrival_time), to_ns(max(req.finished_time, req.arrival_time))
    ids = getattr(tracer, "id_generator", None)
    preset = isinstance(ids, PresetIdGenerator) and req.span_context is not None and req.span_context.is_valid
    if preset:
        ids.preset(req.span_context.trace_id, req.span_context.span_id)
    try:
        span = tracer.start_span(req.span_name, context=parent_context(req.trace_headers), kind=SpanKind.SERVER,
                                 attributes=attrs, start_time=start_ns, links=links)
    finally:
        if preset:
            ids.clear()  # a sampled-out span asks for no ids; the next span must not inherit them
    engine = _engine_clock(req, clock)

    def child(name: str, begin_mono: float, end_mono: float, extra: dict | None = None) -> None:
        if not begin_mono or not end_mono or end_mono < begin_mono:
            return
        begin = min(max(to_ns(engine.to_wall(begin_mono)), start_ns), end_ns)
        end = min(max(to_ns(engine.to_wall(end_mono)), begin), end_ns)
        ctx = trace.set_span_in_context(span, Context())
        tracer.start_span(name, context=ctx, kind=SpanKind.INTERNAL, attributes=extra, start_time=begin).end(end)

    child(SPAN_QUEUE, req.queued_ts, req.scheduled_ts)
    child(SPAN_PREFILL, req.scheduled_ts, req.first_token_ts, {"gen_ai.usage.input_tokens": req.input_tokens})
    if req.output_tokens > 1:
        child(SPAN_DECODE, req.first_token_ts, req.last_token_ts, {"gen_ai.usage.output_tokens": req.output_tokens - 1})
    if req.error_type:
        span.set_status(Status(StatusCode.ERROR, f"request ended: {req.finish_reason}"))
    span.end(end_ns)
    if instruments is not None:
        context = trace.set_span_in_context(span, Context()) if instruments.exemplars else None
        record_request_metrics(req, instruments, provider, context)
    return span.get_span_context()


def record_request_metrics(req: FinishedRequest, instruments: RequestInstruments, provider: str,
                           context: Context | None = None) -> None:
    """The request's metrics; its histograms in ``context`` (the request span's: their exemplars')."""
    base = {"gen_ai.operation.name": req.operation, **_provider(provider), "gen_ai.request.model": req.model}
    error = req.error_type
    with_error = {**base, "error.type": error} if error else base
    instruments.requests.add(1, with_error)
    if req.input_tokens:
        instruments.tokens.add(req.input_tokens, {**base, "gen_ai.token.type": "input"})
    if req.output_tokens:
        instruments.tokens.add(req.output_tokens, {**base, "gen_ai.token.type": "output"})
    if instruments.exemplars:  # the request id: kept off the series by the request Views (instruments.py)
        base = {**base, EXEMPLAR_REQUEST_ID: req.request_id}
        with_error = {**with_error, EXEMPLAR_REQUEST_ID: req.request_id}
    instruments.duration.record(max(req.finished_time - req.arrival_time, 0.0), with_error, context=context)
    queue_time = req.queue_time
    if queue_time is not None and queue_time >= 0:
        instruments.queue_time.record(queue_time, base, context=context)
    if error:
        return  # the two per-token latencies are defined for successful responses only
    if req.time_to_first_token > 0:
        instruments.time_to_first_token.record(req.time_to_first_token, base, context=context)
    tpot = req.time_per_output_token
    if tpot is not None and tpot >= 0:
        instruments.time_per_output_token.record(tpot, base, context=context)
