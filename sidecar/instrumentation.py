"""The public API for a serving loop instrumented by hand: ``sidecar.instrument(...)`` (docs/engine-api.md).

One ``Instrumentation`` per process (per engine object, for an integration with several in one
process). Built over the same pieces every engine integration uses, nothing of its own on the path:

- the process's ``Probe`` (``sidecar.integration.attach.attach_probe``): captures, hidden-sync scans,
  the flight recorder, the stacks and requests views, the step watchdog;
- its ``Telemetry`` (``attach_telemetry``): step metrics, process samplers, and the request spans
  and metrics of ``sidecar.telemetry.record_request``, which the finished requests feed;
- the flight recorder's ring of finished requests, and the requests in flight (``GET /requests``).

The rules it keeps:

- **Never raise into the serving loop.** Every method on the serving path catches what fails inside,
  logs it (once per method, then at debug level) and returns. Only ``instrument()`` itself raises, and
  only for a wrong argument (a role the profile lacks, an unknown keyword): a bug found on the first
  run, not in serving.
- **Nearly free when there is nothing to do.** With ``SIDECAR_DISABLE=1`` nothing is built: each call
  is an attribute read and a return. With no sidecar listening the probe's link thread retries in
  the background (0.2 → 2 s) and metric pushes fail quietly; the step path does not change.
- **A lean step path.** ``step()`` / ``step_begin`` / ``step_end`` are the probe's own calls (a slot
  check and the flight recorder's row) plus, with telemetry, two clock reads and a deque append. No
  network, no export, no allocation: the step context is one reused object.
- **No module-level mutable state.** Everything lives on the ``Instrumentation``; two can coexist.

The request calls may come from any thread (the HTTP handlers' event loop, the step thread): the
requests in flight are a dict under a lock. ``request_finished`` creates the request's span tree and
records its metrics in memory (the span processor exports on its own thread, the metrics are pushed
by the reader's thread): call it where the request ends for the client, as an HTTP handler does.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Mapping

from .common import config
from .engine import SCHEDULER, EngineProfile, Role

if TYPE_CHECKING:  # imported when the first Instrumentation is built: ``import sidecar`` stays light
    from opentelemetry.trace import SpanContext

    from .probe import Probe
    from .telemetry import FinishedRequest, Telemetry

log = logging.getLogger(__name__)

# ``FinishedRequest.operation`` values (the GenAI conventions' ``gen_ai.operation.name``).
OPERATION_TEXT_COMPLETION = "text_completion"
OPERATION_CHAT = "chat"
# The incoming headers that carry the caller's trace (W3C Trace Context); the others are dropped.
TRACE_HEADERS = ("traceparent", "tracestate")
# Requests started and never finished are forgotten, oldest first, beyond this many.
MAX_REQUESTS_IN_FLIGHT = 65536
# The flight recorder's outcome of a request, by finish reason (sidecar/probe/flight_ring.py's OUTCOMES).
_OUTCOME_BY_FINISH_REASON = {"abort": "aborted", "error": "error"}
# The probe's arguments that instrument() sets itself (the others pass through ``probe_options``).
_SET_HERE = frozenset({"role", "rank", "profile", "loop"})


def instrument(
    engine: str | EngineProfile = "engine",
    *,
    role: str | None = None,
    rank: int | None = None,
    model: str = "",
    loop: asyncio.AbstractEventLoop | None = None,
    telemetry: "bool | Telemetry" = True,
    gpu_metrics: bool = True,
    **probe_options: Any,
) -> "Instrumentation":
    """Instrument this process of a serving loop; see ``Instrumentation`` and docs/engine-api.md.

    ``engine``: a name (a single-process engine: one step-driven role, ``scheduler``, that schedules,
    runs the model and serves requests) or a full ``EngineProfile`` (its roles, phase rules,
    allowlist, OpenTelemetry names). ``role``: this process's role in the profile; default its first
    step-driven role. ``rank``: this process's rank among the processes of its role, if it has one.
    ``model``: the default ``gen_ai.request.model`` of its requests. ``loop``: for a window role (an
    API server), the event loop its captures record on; default the running loop, if any.
    ``telemetry``: False for none, or a ready ``sidecar.telemetry.Telemetry`` instead of one from the
    environment. ``gpu_metrics``: sample the host's GPUs through NVML (one process per host should).
    ``probe_options``: passed to ``sidecar.probe.Probe`` (``trace_root``, ``limits``, ``endpoint``, ...).
    """
    if isinstance(engine, EngineProfile):
        profile = engine
    elif isinstance(engine, str) and engine:
        profile = EngineProfile(name=engine, roles=(SCHEDULER,), service_name=engine)
    else:
        raise ValueError(f"engine must be a non-empty name or an EngineProfile, got {engine!r}")
    chosen = profile.role(role) if role is not None else next(r for r in profile.roles if r.step_driven)
    from .probe import Probe

    unknown = sorted(set(probe_options) - (set(inspect.signature(Probe).parameters) - _SET_HERE))
    if unknown:
        raise TypeError(f"instrument() got an unexpected keyword argument {unknown[0]!r}")
    if loop is None and not chosen.step_driven:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
    return Instrumentation(profile, chosen, rank, model=model, loop=loop, telemetry=telemetry,
                           gpu_metrics=gpu_metrics, **probe_options)


class Step:
    """The step context ``Instrumentation.step()`` returns, one reused object per instrumentation.

    Set what the loop knows of the step before the block ends (``-1``: not known): ``batch``
    (requests in it), ``tokens`` (tokens it computed; ``prefill_tokens`` + ``decode_tokens`` when the
    loop knows the split), ``running`` / ``waiting`` (the scheduler's queues). ``did_work``: whether
    the step ran the model (default: the ``has_work`` it was opened with). An exception in the block
    still ends the step, and goes on to the caller.
    """

    __slots__ = ("_inst", "has_work", "did_work", "batch", "tokens", "prefill_tokens", "decode_tokens",
                 "running", "waiting")

    def __init__(self, inst: "Instrumentation") -> None:
        self._inst = inst
        self.has_work = True
        self.did_work: bool | None = None
        self.batch = self.tokens = self.prefill_tokens = self.decode_tokens = self.running = self.waiting = -1

    def __enter__(self) -> "Step":
        inst = self._inst
        if inst._step_probe is not None or inst._steps is not None:  # else: nothing to tell
            inst.step_begin(self.has_work)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        inst = self._inst
        if inst._step_probe is not None or inst._steps is not None:
            inst.step_end(self.has_work if self.did_work is None else self.did_work, self.batch, self.tokens,
                          self.prefill_tokens, self.decode_tokens, self.running, self.waiting)
        return False


class _Request:
    """A request in flight: what its span and the flight recorder will need when it finishes."""

    __slots__ = ("id", "model", "operation", "arrival", "arrival_mono", "scheduled", "first_token",
                 "input_tokens", "max_tokens", "temperature", "top_p", "trace_headers", "span_context")

    def __init__(self, request_id: str, model: str, operation: str, input_tokens: int, max_tokens: int | None,
                 temperature: float | None, top_p: float | None, trace_headers: dict | None, span_context) -> None:
        self.id, self.model, self.operation = request_id, model, operation
        self.arrival, self.arrival_mono = time.time(), time.monotonic()
        self.scheduled = self.first_token = 0.0  # monotonic, s; 0.0: not yet
        self.input_tokens, self.max_tokens, self.temperature, self.top_p = input_tokens, max_tokens, temperature, top_p
        self.trace_headers, self.span_context = trace_headers, span_context

    def phase(self) -> str:
        if not self.scheduled:
            return "queued"
        return "prefill" if not self.first_token else "decode"


class Instrumentation:
    """One process's (or engine object's) instrumentation: its probe, its telemetry, its requests.

    Build it with ``sidecar.instrument``. Attributes: ``profile`` (the ``EngineProfile``), ``role``
    (this process's ``Role``), ``rank``, ``probe`` (the ``Probe``, None when off or failed to start),
    ``telemetry`` (the ``Telemetry``, None when off), ``enabled`` (either is on).
    """

    def __init__(self, profile: EngineProfile, role: Role, rank: int | None = None, *, model: str = "",
                 loop: asyncio.AbstractEventLoop | None = None, telemetry: "bool | Telemetry" = True,
                 gpu_metrics: bool = True, **probe_options: Any) -> None:
        self.profile, self.role, self.rank, self.model = profile, role, rank, model
        self.probe: Probe | None = None
        self.telemetry: Telemetry | None = None
        self._steps = None  # the telemetry's StepRecorder (step-driven roles)
        self._step_probe: Probe | None = None  # the probe, where this role counts steps
        self._t0 = 0
        self._step = Step(self)
        self._lock = threading.Lock()
        self._active: dict[str, _Request] = {}
        self._in_flight = None  # sidecar.telemetry.InFlightRequests: span ids chosen on arrival
        self._ring = None  # the flight recorder's RequestRing
        self._logged: set[str] = set()
        self._closed = False
        self._owns_telemetry = True
        if config.disabled():  # SIDECAR_DISABLE=1: nothing is built, every call returns at once
            return
        try:
            self._build(loop, telemetry, gpu_metrics, probe_options)
        except Exception as exc:  # a broken environment never stops the serving loop
            log.warning("inference-sidecar: instrumentation of %s is off: %s", role.name, exc)

    def _build(self, loop, telemetry, gpu_metrics: bool, probe_options: dict[str, Any]) -> None:
        from .integration import attach
        from .telemetry import CaptureSpans, InFlightRequests, Telemetry

        profile, role = self.profile, self.role
        if isinstance(telemetry, Telemetry):  # the caller's: it shuts it down, not close()
            self._owns_telemetry = False
            self.telemetry = telemetry if telemetry.settings.enabled else None
            if self.telemetry is not None and role.step_driven:
                self._steps = telemetry.step_recorder(role.name)
        elif telemetry:
            self.telemetry = attach.attach_telemetry(self, profile, role.name, self.rank, steps=role.step_driven,
                                                     gpu=gpu_metrics)
            self._steps = self.__dict__.get(attach.STEPS_ATTR)
        on_report = None
        if self.telemetry is not None and self.telemetry.traces_on:
            self._in_flight = InFlightRequests()
            # A capture becomes a span linked to the requests in flight while it recorded, from the
            # reports the probe passes on (sidecar.telemetry.CaptureSpans).
            on_report = CaptureSpans(self.telemetry.tracer, self._in_flight, config.endpoint()).on_report
        probe_options.setdefault("in_flight", self.requests_in_flight)
        if on_report is not None:
            probe_options.setdefault("on_capture_report", on_report)
        if not role.step_driven:
            probe_options.setdefault("loop", loop)
        # This process serves requests whatever its role: the flight recorder keeps its finished ones.
        probe_options.setdefault("request_ring", True)
        self.probe = attach.attach_probe(self, profile, role.name, self.rank, **probe_options)
        if self.probe is not None:
            self._ring = self.probe.request_ring
            if role.step_driven:
                self._step_probe = self.probe

    @property
    def enabled(self) -> bool:
        return self.probe is not None or self.telemetry is not None

    def _failed(self, where: str, exc: BaseException) -> None:
        if where in self._logged:
            log.debug("inference-sidecar: %s failed: %s", where, exc)
            return
        self._logged.add(where)
        log.warning("inference-sidecar: %s failed (the serving loop goes on; logged once): %s", where, exc,
                    exc_info=True)

    # -- the step path ---------------------------------------------------------------------------------
    def step(self, has_work: bool = True) -> Step:
        """``with inst.step(has_work) as step: ...`` around one engine step (the step thread only:
        steps do not nest). ``has_work``: the step will run the model; an idle pass of the loop is
        ``False`` (or is no step at all: a loop that blocks while idle takes none)."""
        s = self._step
        s.has_work, s.did_work = has_work, None
        s.batch = s.tokens = s.prefill_tokens = s.decode_tokens = s.running = s.waiting = -1
        return s

    def step_begin(self, has_work: bool = True) -> None:
        """Before one engine step, on the step thread (``step()`` calls it)."""
        probe = self._step_probe
        if probe is not None:
            try:
                probe.step_begin(has_work)
            except Exception as exc:
                self._failed("step_begin", exc)
        if self._steps is not None:
            self._t0 = time.time_ns()

    def step_end(self, did_work: bool = True, batch: int = -1, tokens: int = -1, prefill_tokens: int = -1,
                 decode_tokens: int = -1, running: int = -1, waiting: int = -1) -> None:
        """After that step, on the same thread (``step()`` calls it). The counts go to the flight
        recorder and the step metrics (``-1``: not known)."""
        probe = self._step_probe
        if probe is not None:
            try:
                probe.step_end(did_work, batch, tokens, prefill_tokens, decode_tokens, running, waiting)
            except Exception as exc:
                self._failed("step_end", exc)
        steps = self._steps
        if steps is not None and did_work:
            try:
                steps.observe(self._t0, time.time_ns(), max(batch, 0), max(tokens, 0))
            except Exception as exc:
                self._failed("step metrics", exc)

    # -- requests ----------------------------------------------------------------------------------------
    def request_started(self, request_id: str, *, input_tokens: int = 0, model: str | None = None,
                        operation: str = OPERATION_TEXT_COMPLETION, max_tokens: int | None = None,
                        temperature: float | None = None, top_p: float | None = None,
                        trace_headers: Mapping[str, str] | None = None) -> None:
        """The server received ``request_id`` (any thread). ``trace_headers``: the request's HTTP
        headers (only ``traceparent`` / ``tracestate`` are kept): its span joins the caller's trace."""
        if not self.enabled:
            return
        try:
            headers = _trace_headers(trace_headers)
            in_flight = self._in_flight
            span_context = in_flight.begin(request_id, headers) if in_flight is not None else None
            req = _Request(request_id, model or self.model or "unknown", operation, int(input_tokens), max_tokens,
                           temperature, top_p, headers, span_context)
            with self._lock:
                active = self._active
                if len(active) >= MAX_REQUESTS_IN_FLIGHT and request_id not in active:
                    active.pop(next(iter(active)))  # never finished: forget the oldest
                active[request_id] = req
        except Exception as exc:
            self._failed("request_started", exc)

    def request_scheduled(self, request_id: str) -> None:
        """The loop put ``request_id`` in a batch for the first time (its queue time ends, its
        prefill begins). Optional: without it the request has no queue span and no queue time."""
        try:
            req = self._active.get(request_id)
            if req is not None and not req.scheduled:
                req.scheduled = time.monotonic()
        except Exception as exc:  # an unhashable id
            self._failed("request_scheduled", exc)

    def request_first_token(self, request_id: str) -> None:
        """The first output token of ``request_id`` is out (sent, or about to be): its time to first
        token ends here. Later calls are ignored."""
        try:
            req = self._active.get(request_id)
            if req is not None and not req.first_token:
                req.first_token = time.monotonic()
        except Exception as exc:
            self._failed("request_first_token", exc)

    def request_finished(self, request_id: str, *, output_tokens: int = 0, finish_reason: str = "stop",
                         input_tokens: int | None = None, cached_input_tokens: int = 0,
                         preemptions: int = 0) -> "SpanContext | None":
        """``request_id`` ended (any thread): its span tree, metrics and flight-recorder row.
        ``finish_reason``: ``stop``, ``length``, ``abort`` (the client left; ``error.type=aborted``) or
        ``error``. Returns the request span's context (None: unknown request, or telemetry off)."""
        if not self.enabled:
            return None
        try:
            finished, finished_mono = time.time(), time.monotonic()
            with self._lock:
                req = self._active.pop(request_id, None)
            if req is None:
                log.debug("inference-sidecar: request %s finished but was never started", request_id)
                return None
            from .telemetry import FinishedRequest

            return self.record_finished(FinishedRequest(
                request_id=request_id, model=req.model, operation=req.operation,
                finish_reason=str(finish_reason).lower(), arrival_time=req.arrival, finished_time=finished,
                queued_ts=req.arrival_mono, scheduled_ts=req.scheduled, first_token_ts=req.first_token,
                last_token_ts=finished_mono if req.first_token else 0.0,
                time_to_first_token=req.first_token - req.arrival_mono if req.first_token else 0.0,
                input_tokens=req.input_tokens if input_tokens is None else int(input_tokens),
                output_tokens=int(output_tokens), cached_input_tokens=int(cached_input_tokens),
                preemptions=int(preemptions), max_tokens=req.max_tokens, temperature=req.temperature,
                top_p=req.top_p, trace_headers=req.trace_headers, span_context=req.span_context))
        except Exception as exc:
            self._failed("request_finished", exc)
            return None

    def record_finished(self, request: "FinishedRequest") -> "SpanContext | None":
        """Record a finished request the caller built itself (an integration with the engine's own
        timestamps): its span tree and metrics (``sidecar.telemetry.record_request``, with this
        profile's provider) and its flight-recorder row. Returns its span's context."""
        if not self.enabled:
            return None
        span = None
        try:
            if self._in_flight is not None:
                self._in_flight.end(request.request_id, request.finished_time)
            telemetry = self.telemetry
            if telemetry is not None:
                from .telemetry import ClockOffset, record_request

                span = record_request(request, telemetry.tracer, telemetry.requests, ClockOffset.measure(),
                                      provider=self.profile.provider)
            ring = self._ring
            if ring is not None:
                arrived_ns = int(request.arrival_time * 1e9)
                ttft = request.time_to_first_token
                ring.add(request.request_id, arrived_ns, arrived_ns + int(ttft * 1e9) if ttft > 0 else -1,
                         int(request.finished_time * 1e9),
                         _OUTCOME_BY_FINISH_REASON.get(request.finish_reason, "finished"),
                         request.input_tokens, request.output_tokens)
        except Exception as exc:
            self._failed("record_finished", exc)
        return span

    def requests_in_flight(self) -> list[dict[str, Any]]:
        """The requests started and not finished, oldest first: what ``GET /requests`` and the
        heartbeat's in-flight count show (the probe calls it on its link thread)."""
        with self._lock:
            requests = list(self._active.values())
        now = time.time()
        return [{"id": r.id, "arrived_ns": int(r.arrival * 1e9), "age_s": round(max(0.0, now - r.arrival), 3),
                 "phase": r.phase(), "prompt_tokens": r.input_tokens} for r in requests]

    # -- life ---------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the probe and flush the telemetry (bounded). Idempotent; at exit the telemetry flushes
        by itself."""
        if self._closed:
            return
        self._closed = True
        self._step_probe = None
        for what, close in (("probe", self.probe.close if self.probe is not None else None),
                            ("telemetry", self.telemetry.shutdown
                             if self.telemetry is not None and self._owns_telemetry else None)):
            if close is not None:
                try:
                    close()
                except Exception as exc:
                    self._failed(f"closing the {what}", exc)

    def __enter__(self) -> "Instrumentation":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "on" if self.enabled else "off"
        return f"<Instrumentation {self.profile.name}/{self.role.name} rank={self.rank} {state}>"


def _trace_headers(headers: Mapping[str, str] | None) -> dict[str, str] | None:
    if not headers:
        return None
    kept = {k.lower(): v for k, v in headers.items() if k.lower() in TRACE_HEADERS}
    return kept or None
