"""Step metrics and optional step spans for engine and worker processes.

``StepRecorder.observe`` is what an engine integration calls on the step path: one tuple appended to
a bounded deque (a full deque drops its oldest entry; drops are counted). The sampler thread calls
``drain`` to turn the entries into histogram records and, for the fraction ``span_ratio`` of steps,
into spans. Step spans are off unless ``SIDECAR_STEP_SPANS_RATIO`` asks for them.
"""

from __future__ import annotations

import collections
import math

from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Tracer

from .instruments import StepInstruments

DEFAULT_CAPACITY = 65536


def step_sampled(index: int, ratio: float) -> bool:
    """Whether step ``index`` (0-based) gets a span: evenly spread, exactly ``ratio`` of all steps."""
    if ratio <= 0:
        return False
    if ratio >= 1:
        return True
    return math.floor((index + 1) * ratio) > math.floor(index * ratio)


class StepRecorder:
    def __init__(self, instruments: StepInstruments, *, role: str, tracer: Tracer | None = None,
                 span_ratio: float = 0.0, capacity: int = DEFAULT_CAPACITY) -> None:
        if not 0.0 <= span_ratio <= 1.0:
            raise ValueError("span_ratio must be in [0, 1]")
        self._instruments = instruments
        self._role = role
        self._tracer = tracer
        self._span_ratio = span_ratio if tracer is not None else 0.0
        self._buffer: collections.deque = collections.deque(maxlen=capacity)
        self.observed = 0
        self.recorded = 0
        self._attrs = {"sidecar.process.role": role}

    # -- step path ----------------------------------------------------------------------------------
    def observe(self, start_ns: int, end_ns: int, batch_size: int, tokens: int) -> None:
        """One finished step: wall-clock bounds (``time.time_ns()``), requests and tokens scheduled."""
        self.observed += 1
        self._buffer.append((self.observed - 1, start_ns, end_ns, batch_size, tokens))

    @property
    def dropped(self) -> int:
        return self.observed - self.recorded - len(self._buffer)

    # -- sampler thread -----------------------------------------------------------------------------
    def drain(self) -> None:
        inst, attrs = self._instruments, self._attrs
        while True:
            try:
                index, start_ns, end_ns, batch_size, tokens = self._buffer.popleft()
            except IndexError:
                return
            inst.duration.record(max(end_ns - start_ns, 0) / 1e9, attrs)
            inst.batch_size.record(batch_size, attrs)
            inst.tokens.record(tokens, attrs)
            self.recorded += 1
            if self._span_ratio and step_sampled(index, self._span_ratio):
                span = self._tracer.start_span(
                    f"{self._role} step", context=Context(), kind=SpanKind.INTERNAL, start_time=start_ns,
                    attributes={"sidecar.step.index": index, "sidecar.step.batch_size": batch_size,
                                "sidecar.step.tokens": tokens, **attrs})
                span.end(end_ns)
