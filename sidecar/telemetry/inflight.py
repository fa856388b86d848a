"""A request span's identity, and the requests in flight with theirs chosen when they arrive.

A request span is created when its request finishes (it carries the engine's timestamps), but a
capture that ends while requests are still running must link to their spans. So each request's span
context is allocated on arrival (``InFlightRequests.begin``, ``new_span_context``), and
``requests.record_request`` later creates the span with exactly those ids (``PresetIdGenerator``, the
tracer provider's id generator). Either way its parent is the caller's span from the incoming W3C
headers (``parent_context``). This module is the one place of that identity: requests.py imports it,
never the other way round.

``overlapping(start, end)`` answers "which requests were in flight during [start, end]": those still
running, plus those that finished after ``start`` (kept in a bounded ring of recently finished ones).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Mapping

from opentelemetry.context import Context
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import SpanContext, TraceFlags, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

DEFAULT_FINISHED_CAPACITY = 4096
DEFAULT_ACTIVE_CAPACITY = 65536

_PROPAGATOR = TraceContextTextMapPropagator()


def parent_context(trace_headers: Mapping[str, str] | None) -> Context:
    """The caller's context from W3C headers, or an empty one (a new trace, never an ambient span)."""
    if not trace_headers:
        return Context()
    return _PROPAGATOR.extract(carrier={k.lower(): v for k, v in trace_headers.items()}, context=Context())


class PresetIdGenerator(IdGenerator):
    """Random ids, except for the next span started on this thread after ``preset(...)``."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._next = threading.local()

    def preset(self, trace_id: int, span_id: int) -> None:
        self._next.trace_id, self._next.span_id = trace_id, span_id

    def clear(self) -> None:
        self._next.trace_id = self._next.span_id = 0

    def is_trace_id_random(self) -> bool:
        return True

    def generate_trace_id(self) -> int:  # only asked for when the span has no parent
        trace_id = getattr(self._next, "trace_id", 0)
        self._next.trace_id = 0
        return trace_id or self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        span_id = getattr(self._next, "span_id", 0)
        self._next.span_id = 0
        return span_id or self._random.generate_span_id()


def new_span_context(trace_headers: Mapping[str, str] | None = None,
                     ids: IdGenerator | None = None) -> SpanContext:
    """The span context a request span will have: the caller's trace (W3C headers) or a new one."""
    ids = ids or RandomIdGenerator()
    parent = get_current_span(parent_context(trace_headers)).get_span_context()
    trace_id = parent.trace_id if parent.is_valid else ids.generate_trace_id()
    flags = parent.trace_flags if parent.is_valid else TraceFlags(TraceFlags.SAMPLED)
    return SpanContext(trace_id, ids.generate_span_id(), is_remote=False, trace_flags=flags)


class InFlightRequests:
    """Thread-safe; ``begin`` / ``end`` are a dict operation each under an uncontended lock."""

    def __init__(self, finished_capacity: int = DEFAULT_FINISHED_CAPACITY,
                 active_capacity: int = DEFAULT_ACTIVE_CAPACITY) -> None:
        if finished_capacity < 1 or active_capacity < 1:
            raise ValueError("capacities must be positive")
        self._active: dict[str, tuple[SpanContext, float]] = {}
        self._active_capacity = active_capacity
        self._finished: collections.deque = collections.deque(maxlen=finished_capacity)
        self._lock = threading.Lock()

    def begin(self, request_id: str, trace_headers: Mapping[str, str] | None = None,
              now: float | None = None) -> SpanContext:
        ctx = new_span_context(trace_headers)
        with self._lock:
            if len(self._active) >= self._active_capacity:  # requests never ended: forget the oldest
                self._active.pop(next(iter(self._active)))
            self._active[request_id] = (ctx, time.time() if now is None else now)
        return ctx

    def end(self, request_id: str, now: float | None = None) -> SpanContext | None:
        with self._lock:
            entry = self._active.pop(request_id, None)
            if entry is not None:
                self._finished.append((entry[0], entry[1], time.time() if now is None else now))
        return entry[0] if entry else None

    def get(self, request_id: str) -> SpanContext | None:
        entry = self._active.get(request_id)
        return entry[0] if entry else None

    def __len__(self) -> int:
        return len(self._active)

    def overlapping(self, start: float, end: float) -> list[SpanContext]:
        """Span contexts of the requests in flight at some time within [start, end] (wall clock, s)."""
        with self._lock:
            active = [ctx for ctx, began in self._active.values() if began <= end]
            finished = [ctx for ctx, began, ended in self._finished if ended >= start and began <= end]
        return finished + active
