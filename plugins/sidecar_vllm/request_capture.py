"""Request-scoped captures in vLLM's API server (docs/api.md, "Captures of one request").

A request with ``X-Sidecar-Profile: 1`` (or W3C baggage ``sidecar.profile=1``) waits, before it
reaches the engine, until a capture bound to it is armed in every engine process; the capture then
records its prefill step and its decode steps, at most ``SIDECAR_REQUEST_CAPTURE_STEPS``, and ends
when the request does.

- ``BaseServing._get_trace_headers``: where every OpenAI endpoint reads a request's propagation
  headers, in the request's own task, right before it calls ``generate``. The ask is read there
  (sidecar/probe/profile_header.py) into ``_ASK``, a ContextVar: that request's task's own.
- ``AsyncLLM.generate``: a call whose task carries an ask not yet taken gets a generator that first
  asks the sidecar through the API server's probe (sidecar/probe/request_capture.py: awaited on the
  event loop, bounded), then runs vLLM's own, whose first step adds the request to the engine: the
  capture is armed before the request's first step. Any other call gets vLLM's generator itself.
  One capture per HTTP request: a completion with several prompts captures the first one's engine
  request (with ``n`` > 1, all its samples: they are added together).
- When that generator ends (the request finished, failed, or its client left), the capture is ended
  on the engine's step threads through vLLM's own utility call (capture_end.py); a capture that
  reached its step cap first has already ended.
- What became of the ask (``CaptureOutcome``) reaches request telemetry in ``CAPTURED``, set around
  the first step of vLLM's generator, where ``OutputProcessor.add_request`` reads it (stat_logger.py):
  the request's span names its capture, or why it has none. The capture's span links to the request's.

Nothing here can fail or stall a request: a sidecar absent, busy or slow means the request is served
uncaptured, at most ``WAIT_S`` later, and the reason is on its span (and, from the sidecar, in
``sidecar_request_captures_total``).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from dataclasses import dataclass
from typing import Any, AsyncGenerator

from sidecar.integration import patching
from sidecar.probe.profile_header import ProfileAsk, read_profile_ask
from sidecar.probe.request_capture import CaptureOutcome, RequestCaptureAsks, steps_from_environment
from sidecar.telemetry.capture import BoundRequest

from .capture_end import END_CAPTURE

log = logging.getLogger(__name__)

GATE_ATTR = "_inference_sidecar_request_captures"  # on an AsyncLLM: its RequestCaptureGate
END_TIMEOUT_S = 30.0  # the engine core answers a utility call between two steps


@dataclass(eq=False)
class _Ask:
    headers: Any  # the request's headers object: the same one for each of its prompts
    profile: ProfileAsk
    taken: bool = False  # its first generate call took it


_ASK: contextvars.ContextVar[_Ask | None] = contextvars.ContextVar("inference_sidecar_profile_ask", default=None)
# The ask's outcome while vLLM adds the request to its OutputProcessor (read in stat_logger.py).
CAPTURED: contextvars.ContextVar[CaptureOutcome | None] = contextvars.ContextVar(
    "inference_sidecar_captured", default=None)


class RequestCaptureGate:
    """One per ``AsyncLLM``: asks for a request's capture, holds the request meanwhile, ends the
    capture with the request."""

    def __init__(self, engine: Any, asks: RequestCaptureAsks, steps: int, capture_spans: Any = None) -> None:
        """``engine``: the AsyncLLM (its engine-core client ends the capture); ``capture_spans``: the
        ``CaptureSpans`` of request telemetry, None when spans are off."""
        self._engine = engine
        self._asks = asks
        self.steps = steps
        self._spans = capture_spans
        self._tasks: set[asyncio.Task] = set()

    async def captured(self, profile: ProfileAsk, request_id: str,
                       generator: AsyncGenerator) -> AsyncGenerator:
        """``generator`` (vLLM's, not started), started once the request's capture is armed or
        skipped, and followed by the capture's end."""
        outcome = await self._arm(profile, request_id)  # cancelled here: vLLM's generator never ran
        try:
            token = CAPTURED.set(outcome)
            try:
                first = await generator.__anext__()  # adds the request to the engine
            except StopAsyncIteration:
                return
            finally:
                CAPTURED.reset(token)
            self._bind(outcome, request_id)
            yield first
            async for output in generator:
                yield output
        finally:
            self._end(outcome)
            await generator.aclose()

    async def _arm(self, profile: ProfileAsk, request_id: str) -> CaptureOutcome:
        if not profile.asked:
            return CaptureOutcome(skipped=profile.problem)
        outcome = await self._asks.ask(request_id, self.steps)
        if outcome.capture_id is None:
            log.debug("inference-sidecar: request %s served uncaptured: %s", request_id, outcome.skipped)
        else:  # named by the capture's span even if the request fails before its span ids are chosen
            self._bind(outcome, request_id)
        return outcome

    def _bind(self, outcome: CaptureOutcome, request_id: str) -> None:
        """The capture's span names the request, and links to its span once its ids are chosen (after
        vLLM's first step of the request; before it, ``span_context`` is None)."""
        if outcome.capture_id is not None and self._spans is not None:
            self._spans.bind_request(outcome.capture_id, BoundRequest(request_id, outcome.span_context))

    def _end(self, outcome: CaptureOutcome) -> None:
        if outcome.capture_id is None:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._end_in_engine(outcome.capture_id))
        except RuntimeError:  # no running loop (interpreter shutdown): the capture ends at its step cap
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _end_in_engine(self, capture_id: str) -> None:
        try:
            await asyncio.wait_for(self._engine.engine_core.call_utility_async(END_CAPTURE, capture_id),
                                   END_TIMEOUT_S)
        except Exception as exc:
            log.warning("inference-sidecar: capture %s not ended with its request (%s); it ends at its step cap "
                        "or its timeout", capture_id, exc)


def attach_request_captures(async_llm: Any, probe: Any, capture_spans: Any = None) -> RequestCaptureGate | None:
    """Give ``async_llm`` its gate, asking through ``probe`` (the API server's); None without one, or
    with request-scoped captures off."""
    asks = getattr(probe, "request_captures", None)
    steps = steps_from_environment()
    if asks is None or steps == 0:  # SIDECAR_REQUEST_CAPTURE_STEPS=0: requests' asks are not read
        return None
    install()  # here, in the API server: the engine's other processes never import its HTTP layer
    gate = RequestCaptureGate(async_llm, asks, steps, capture_spans)
    async_llm.__dict__[GATE_ATTR] = gate
    return gate


# -- request-path patches ---------------------------------------------------------------------------
def _wrap_get_trace_headers(original):
    async def _get_trace_headers(self, headers):
        current = _ASK.get()
        if current is None or current.headers is not headers:  # each prompt of a request reads the same headers
            profile = read_profile_ask(headers)
            _ASK.set(_Ask(headers, profile) if profile.asked or profile.problem else None)
        return await original(self, headers)

    return _get_trace_headers


def _wrap_generate(original):
    signature = inspect.signature(original)

    def generate(self, *args, **kwargs):
        ask = _ASK.get()
        gate = self.__dict__.get(GATE_ATTR)
        if ask is None or ask.taken or gate is None:
            return original(self, *args, **kwargs)
        ask.taken = True
        try:
            request_id = str(signature.bind(self, *args, **kwargs).arguments["request_id"])
        except (TypeError, KeyError):  # a call vLLM itself would refuse: let it
            return original(self, *args, **kwargs)
        return gate.captured(ask.profile, request_id, original(self, *args, **kwargs))

    return generate


PATCHES: tuple[patching.Patch, ...] = (
    ("vllm.entrypoints.serve.engine.serving", "BaseServing", "_get_trace_headers", _wrap_get_trace_headers),
    ("vllm.v1.engine.async_llm", "AsyncLLM", "generate", _wrap_generate),
)


def install() -> None:
    """Apply the request-path patches (idempotent)."""
    patching.install(PATCHES)
