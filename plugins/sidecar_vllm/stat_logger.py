"""Request spans and metrics for vLLM, from the ``vllm.stat_logger_plugins`` entry point.

vLLM builds one ``SidecarStatLogger`` per ``AsyncLLM`` (API server, async engine only; it is an
``AggregateStatLoggerBase``, so data-parallel engines share it) and calls ``record()`` on the API
server's event loop after each batch of engine outputs. vLLM's ``FinishedRequestStats`` keeps only
durations, so three small request-path patches, applied once when the logger is built, hand the
logger what it needs alongside the ``IterationStats`` it already receives:

- ``OutputProcessor._update_stats_from_finished``: the finished request's ``RequestState`` (sampling
  parameters, token counts, and ``RequestStateStats`` with the engine's own timestamps).
- ``OutputProcessor.abort_requests`` / ``process_outputs``: requests aborted by the client never reach
  the stats; they are handed over with the next batch of outputs, with ``error.type=aborted``.
- ``OpenAIServingCompletion.create_completion`` / ``OpenAIServingChat.create_chat_completion``: when
  the server received the request, so spans and time to first token include the prompt's parsing,
  templating and tokenization, which vLLM's own ``arrival_time`` leaves out.
- ``AsyncLLM.add_request`` / ``OutputProcessor.add_request``: the incoming W3C ``traceparent``.
  vLLM 0.32 passes ``trace_headers`` from the OpenAI server to ``AsyncLLM.add_request`` and drops them
  there unless its own ``--otlp-traces-endpoint`` is set; the patch keeps them (in a ContextVar for the
  duration of that call) and attaches them to the request's state, so the request span becomes a child
  of the caller's span with nothing but the standard ``OTEL_*`` variables configured.

A request that asked to be captured (request_capture.py) has what became of its ask in
``request_capture.CAPTURED`` while ``OutputProcessor.add_request`` runs: it is kept on the request's
state for its span (``sidecar.capture.id``, ``.url``, ``.skipped``), and the span ids chosen for the
request are handed back to it, for the capture's span to link to.

With span export on, ``attach_to_async_llm`` (called by hooks.py once ``AsyncLLM`` is built) also
gives the ``OutputProcessor`` an ``InFlightRequests``: each request's span ids are chosen when it
arrives, so a capture span can link to requests still running when the capture ends
(``sidecar.telemetry.CaptureSpans``, fed by the API server's probe).

Everything else (span tree, metrics, export) is engine-agnostic, in ``sidecar.telemetry``. A failure
here is logged once and never reaches vLLM. With ``SIDECAR_TELEMETRY=0`` the logger patches nothing.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import time
from typing import Any, Callable

from vllm.v1.metrics.loggers import AggregateStatLoggerBase

from sidecar.common import config
from sidecar.integration import patching
from sidecar.telemetry import (
    CaptureSpans,
    ClockOffset,
    FinishedRequest,
    InFlightRequests,
    create_telemetry,
    operation_from_request_id,
    record_request,
)

from .profile import ROLE_API_SERVER, VLLM_PROFILE
from .request_capture import CAPTURED

log = logging.getLogger(__name__)

HEADERS_ATTR = "_inference_sidecar_trace_headers"  # on a RequestState
FINISHED_ATTR = "_inference_sidecar_finished"  # on an IterationStats: [(RequestState, finish_reason, wall end)]
ABORTED_ATTR = "_inference_sidecar_aborted"  # on an OutputProcessor: aborted, not yet handed over
IN_FLIGHT_ATTR = "_inference_sidecar_in_flight"  # on an OutputProcessor: its InFlightRequests
SPAN_ATTR = "_inference_sidecar_span_context"  # on a RequestState: the request span's ids, chosen on arrival
CAPTURE_ATTR = "_inference_sidecar_capture"  # on a RequestState: its ask's CaptureOutcome (request_capture.py)

_TRACE_HEADERS: contextvars.ContextVar = contextvars.ContextVar("inference_sidecar_trace_headers", default=None)
# When the OpenAI handler received the request (wall clock). vLLM's own arrival_time is stamped after
# the handler has parsed, templated and tokenized the prompt, time the client waited too.
_HTTP_ARRIVAL: contextvars.ContextVar = contextvars.ContextVar("inference_sidecar_http_arrival", default=None)
HTTP_ARRIVAL_ATTR = "_inference_sidecar_http_arrival"


# -- request-path patches ---------------------------------------------------------------------------


def _wrap_async_add_request(original):
    signature = inspect.signature(original)
    names = list(signature.parameters)
    positional_index = names.index("trace_headers") if "trace_headers" in names else len(names)

    async def add_request(self, *args, **kwargs):
        headers = kwargs.get("trace_headers")
        if headers is None and len(args) >= positional_index:  # passed by position: bind to find it
            headers = signature.bind_partial(self, *args, **kwargs).arguments.get("trace_headers")
        token = _TRACE_HEADERS.set(dict(headers) if headers else None)
        try:
            return await original(self, *args, **kwargs)
        finally:
            _TRACE_HEADERS.reset(token)

    return add_request


def _wrap_handler(original):
    # Set, never reset: each HTTP request runs in its own task (so its own context), and a streamed
    # response reaches AsyncLLM.add_request only later, from tasks that copy this context.
    async def handler(self, *args, **kwargs):
        _HTTP_ARRIVAL.set(time.time())
        return await original(self, *args, **kwargs)

    return handler


def _wrap_output_add_request(original):
    def add_request(self, request, *args, **kwargs):
        result = original(self, request, *args, **kwargs)
        headers = _TRACE_HEADERS.get()
        in_flight = self.__dict__.get(IN_FLIGHT_ATTR)
        http_arrival = _HTTP_ARRIVAL.get()
        captured = CAPTURED.get()
        if headers or in_flight is not None or http_arrival is not None or captured is not None:
            state = self.request_states.get(request.request_id)
            if state is not None:
                if http_arrival is not None:
                    state.__dict__[HTTP_ARRIVAL_ATTR] = http_arrival
                if headers:
                    state.__dict__[HEADERS_ATTR] = headers
                if in_flight is not None:
                    state.__dict__[SPAN_ATTR] = in_flight.begin(request.request_id, headers)
                if captured is not None:
                    state.__dict__[CAPTURE_ATTR] = captured
                    captured.span_context = state.__dict__.get(SPAN_ATTR)
        return result

    return add_request


def _wrap_update_stats_from_finished(original):
    def _update_stats_from_finished(self, req_state, finish_reason, iteration_stats):
        result = original(self, req_state, finish_reason, iteration_stats)
        in_flight = self.__dict__.get(IN_FLIGHT_ATTR)
        if in_flight is not None:
            in_flight.end(req_state.request_id)
        if iteration_stats is not None and req_state.stats is not None:
            iteration_stats.__dict__.setdefault(FINISHED_ATTR, []).append(
                (req_state, finish_reason, iteration_stats.iteration_timestamp))
        return result

    return _update_stats_from_finished


def _wrap_abort_requests(original):
    def abort_requests(self, *args, **kwargs):
        before = dict(self.request_states)
        result = original(self, *args, **kwargs)
        now = time.time()
        gone = [state for rid, state in before.items() if rid not in self.request_states and state.stats is not None]
        in_flight = self.__dict__.get(IN_FLIGHT_ATTR)
        if in_flight is not None:
            for rid in before:
                if rid not in self.request_states:
                    in_flight.end(rid, now)
        if gone:
            self.__dict__.setdefault(ABORTED_ATTR, []).extend((state, "abort", now) for state in gone)
        return result

    return abort_requests


def _wrap_process_outputs(original):
    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None, *args, **kwargs):
        aborted = self.__dict__.get(ABORTED_ATTR)
        if aborted and iteration_stats is not None:
            self.__dict__[ABORTED_ATTR] = []
            iteration_stats.__dict__.setdefault(FINISHED_ATTR, []).extend(aborted)
        return original(self, engine_core_outputs, engine_core_timestamp, iteration_stats, *args, **kwargs)

    return process_outputs


PATCHES: tuple[patching.Patch, ...] = (
    ("vllm.v1.engine.async_llm", "AsyncLLM", "add_request", _wrap_async_add_request),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "add_request", _wrap_output_add_request),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "_update_stats_from_finished",
     _wrap_update_stats_from_finished),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "abort_requests", _wrap_abort_requests),
    ("vllm.v1.engine.output_processor", "OutputProcessor", "process_outputs", _wrap_process_outputs),
    ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion", "create_completion", _wrap_handler),
    ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat", "create_chat_completion", _wrap_handler),
)


def install_request_hooks() -> None:
    """Apply the request-path patches (idempotent). Each failing patch is logged; the others apply."""
    patching.install(PATCHES)


# -- vLLM request state → FinishedRequest -----------------------------------------------------------
def finished_request(req_state: Any, finish_reason: Any, finished_time: float, model: str) -> FinishedRequest:
    stats = req_state.stats
    request_id = req_state.external_req_id
    # Start the request where the server received it (see _HTTP_ARRIVAL), not where vLLM stamped it.
    http_arrival = req_state.__dict__.get(HTTP_ARRIVAL_ATTR)
    lead = max(0.0, stats.arrival_time - http_arrival) if http_arrival else 0.0
    captured = req_state.__dict__.get(CAPTURE_ATTR)
    return FinishedRequest(
        request_id=request_id,
        model=req_state.lora_name or model,
        operation=operation_from_request_id(request_id),
        finish_reason=str(finish_reason).lower(),
        arrival_time=stats.arrival_time - lead,
        finished_time=finished_time,
        queued_ts=stats.queued_ts,
        scheduled_ts=stats.scheduled_ts,
        first_token_ts=stats.first_token_ts,
        last_token_ts=stats.last_token_ts,
        time_to_first_token=stats.first_token_latency + lead if stats.first_token_latency else 0.0,
        input_tokens=req_state.prompt_len or 0,
        output_tokens=stats.num_generation_tokens,
        cached_input_tokens=req_state.num_cached_tokens or 0,
        preemptions=stats.num_preemptions,
        max_tokens=req_state.max_tokens_param,
        temperature=req_state.temperature,
        top_p=req_state.top_p,
        trace_headers=req_state.__dict__.get(HEADERS_ATTR),
        span_context=req_state.__dict__.get(SPAN_ATTR),
        capture_id=captured.capture_id if captured is not None else None,
        capture_url=captured.url if captured is not None else None,
        capture_skipped=captured.skipped if captured is not None else None,
    )


def _served_model_name(vllm_config: Any) -> str:
    model_config = vllm_config.model_config
    name = getattr(model_config, "served_model_name", None) or model_config.model
    return name[0] if isinstance(name, (list, tuple)) else str(name)


class SidecarStatLogger(AggregateStatLoggerBase):
    """Named in pyproject.toml under ``vllm.stat_logger_plugins``."""

    def __init__(self, vllm_config: Any, engine_indexes: list[int] | None = None, *, telemetry=None) -> None:
        self.engine_indexes = engine_indexes or [0]
        self.model = _served_model_name(vllm_config)
        self.telemetry = None
        self.in_flight: InFlightRequests | None = None
        self.captures: CaptureSpans | None = None
        # The API server probe's ring of finished requests (the flight recorder); hooks.py sets it.
        self.request_ring = None
        self._failed = False
        try:
            telemetry = telemetry or create_telemetry(ROLE_API_SERVER, profile=VLLM_PROFILE)
            if not telemetry.settings.enabled:
                return  # SIDECAR_TELEMETRY=0 / OTEL_SDK_DISABLED: vLLM's request path stays untouched
            install_request_hooks()
            self.telemetry = telemetry.start_samplers(process=True, gpu=True)
            if telemetry.traces_on:
                self.in_flight = InFlightRequests()
                self.captures = CaptureSpans(telemetry.tracer, self.in_flight, config.endpoint())
        except Exception as exc:
            log.warning("inference-sidecar: request telemetry is off: %s", exc)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
        telemetry = self.telemetry
        if telemetry is None or iteration_stats is None:
            return
        finished = iteration_stats.__dict__.pop(FINISHED_ATTR, None)
        if not finished:
            return
        clock = ClockOffset.measure()
        for req_state, finish_reason, finished_time in finished:
            try:
                request = finished_request(req_state, finish_reason, finished_time, self.model)
                record_request(request, telemetry.tracer, telemetry.requests, clock, provider=VLLM_PROFILE.provider)
                if self.request_ring is not None:
                    _add_to_ring(self.request_ring, request)
            except Exception:
                if not self._failed:
                    self._failed = True
                    log.warning("inference-sidecar: a request span was not recorded (logged once)", exc_info=True)

    def log_engine_initialized(self) -> None:
        pass

    def record_admission_rejection(self, reason: str) -> None:
        pass


_OUTCOME_BY_FINISH_REASON = {"abort": "aborted", "error": "error"}


def _add_to_ring(ring, request: FinishedRequest) -> None:
    arrived_ns = int(request.arrival_time * 1e9)
    first_ns = arrived_ns + int(request.time_to_first_token * 1e9) if request.time_to_first_token > 0 else -1
    ring.add(request.request_id, arrived_ns, first_ns, int(request.finished_time * 1e9),
             _OUTCOME_BY_FINISH_REASON.get(request.finish_reason, "finished"), request.input_tokens,
             request.output_tokens)


def attach_to_async_llm(async_llm: Any) -> SidecarStatLogger | None:
    """Find this package's stat logger among ``async_llm``'s and give its OutputProcessor the in-flight
    registry; returns the logger (None when vLLM built none: stats off, or telemetry off)."""
    manager = getattr(async_llm, "logger_manager", None)
    for logger in getattr(manager, "stat_loggers", None) or ():
        if isinstance(logger, SidecarStatLogger) and logger.telemetry is not None:
            if logger.in_flight is not None:
                async_llm.output_processor.__dict__[IN_FLIGHT_ATTR] = logger.in_flight
            return logger
    return None
