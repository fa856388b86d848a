"""Patches that put a probe on vLLM's step path (vLLM V1, 0.11 and later; checked on 0.32).

- ``EngineCore.step`` / ``step_with_batch_queue``: the engine core's step. ``step_fn`` is bound in
  ``__init__``, so the class is patched before any engine is built (general plugins load first).
- ``Worker.execute_model`` (+ ``sample_tokens`` when sampling is deferred to it): a worker's step.
  CPU, XPU and other workers subclass the GPU ``Worker``.
- ``AsyncLLM.__init__``: the API server, which records for the capture window on its event loop,
  and asks for the captures of requests that ask to be captured (request_capture.py: its
  request-path patches are installed there, in the API server only). The engine core and the
  workers get the method that ends such a capture on their step threads (capture_end.py) with these
  patches.

Step telemetry (docs/telemetry.md): each worker gets a ``StepRecorder`` from ``sidecar.telemetry``;
a worker step with work costs two ``time.time_ns()`` calls (which the flight recorder's row shares)
and one deque append, and the recorder's
drain thread turns those into the ``sidecar.step.*`` histograms. The engine core gets process
samplers (CPU, RSS). ``SIDECAR_TELEMETRY=0`` (or ``OTEL_SDK_DISABLED=true``) leaves both out.

The flight recorder (docs/api.md, ``GET /recorder``): each ``step_end`` passes what the hook knows of
the step: a worker its batch, scheduled tokens and their prefill/decode split, the engine core its
scheduler's running and waiting counts (two ``len()``). The engine core's probe also gets
``requests_view.requests_in_flight`` for ``GET /requests`` and the in-flight gauges.

Each patch is independent (``sidecar.integration.patching``): one that fails is logged and the others
still apply; the engine never fails to start because of this package. Probes and telemetry attach
once per engine object (``sidecar.integration.attach``), as roles of ``VLLM_PROFILE``, each with its
switch of the step's phase ranges (phase_scopes.py): on only while a capture records, so nothing here
changes for a step taken outside one.
"""

from __future__ import annotations

import asyncio
import logging
import os
from operator import countOf
from time import time_ns

from sidecar.common import config
from sidecar.integration import attach, patching
from sidecar.integration.attach import PROBE_ATTR, STEPS_ATTR, TELEMETRY_ATTR  # noqa: F401 (bench, tests)

from . import capture_end
from .phase_scopes import api_server_scopes, engine_core_scopes, worker_scopes
from .model_locator import worker_model
from .profile import ROLE_API_SERVER, ROLE_ENGINE_CORE, ROLE_WORKER, VLLM_PROFILE
from .request_capture import attach_request_captures
from .requests_view import requests_in_flight

log = logging.getLogger(__name__)

PENDING_ATTR = "_inference_sidecar_pending_end"  # a worker step whose sampling is still to come
_MISSING = object()


def _attach_probe(obj, role: str, rank: int | None, **probe_kwargs):
    """``obj``'s probe as a vLLM process (sidecar.integration.attach), of its engine instance."""
    return attach.attach_probe(obj, VLLM_PROFILE, role, rank, instance=engine_instance(obj, role), **probe_kwargs)


def engine_instance(obj, role: str) -> str:
    """The engine instance ``obj`` belongs to: the server's (``SIDECAR_INSTANCE``, which the plugin
    sets in the server's first process and its engine processes inherit; vLLM's own
    ``VllmConfig.instance_id`` differs between the processes of one server), and under data
    parallelism the engine core's sub-instance ``<server>/dp<k>``, since each data-parallel engine
    core counts its own steps: named by the plugin in the engine core's process, from vLLM's name for
    it (``plugin.data_parallel_instance``), and inherited by its workers. A config that still says
    data parallel (an engine launched otherwise) names it from its rank."""
    server = os.environ.get(config.ENV_INSTANCE, "")
    parallel = getattr(getattr(obj, "vllm_config", None), "parallel_config", None)
    if server and role != ROLE_API_SERVER and (getattr(parallel, "data_parallel_size", 1) or 1) > 1:
        suffix = f"/dp{getattr(parallel, 'data_parallel_rank', 0)}"
        return server if server.endswith(suffix) else server + suffix
    return server


def _attach_telemetry(obj, role: str, rank: int | None, *, steps: bool):
    """``obj``'s process telemetry as a vLLM process (sidecar.integration.attach)."""
    return attach.attach_telemetry(obj, VLLM_PROFILE, role, rank, steps=steps)


# -- engine core ----------------------------------------------------------------------------------
def _attach_engine_core_probe(core):
    return _attach_probe(core, ROLE_ENGINE_CORE, None, in_flight=lambda: requests_in_flight(core),
                         phase_scopes=engine_core_scopes(core))


def _wrap_engine_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _attach_engine_core_probe(self)
        _attach_telemetry(self, ROLE_ENGINE_CORE, None, steps=False)

    return __init__


def _wrap_engine_busy_loop(original):
    # In the engine-core process vLLM loads general plugins inside EngineCore.__init__, after our
    # __init__ patch could apply; the busy loop starts right after, so the probe attaches here.
    def run_busy_loop(self, *args, **kwargs):
        _attach_engine_core_probe(self)
        _attach_telemetry(self, ROLE_ENGINE_CORE, None, steps=False)
        return original(self, *args, **kwargs)

    return run_busy_loop


def _wrap_engine_step(original):
    def step(self, *args, **kwargs):
        probe = self.__dict__.get(PROBE_ATTR, _MISSING)
        if probe is _MISSING:
            probe = _attach_engine_core_probe(self)
        if probe is None:
            return original(self, *args, **kwargs)
        scheduler = self.scheduler
        probe.step_begin(scheduler.has_requests())
        result = original(self, *args, **kwargs)
        if probe.ring is not None:  # the flight recorder keeps the scheduler's queue lengths
            probe.step_end(bool(result[1]), -1, -1, -1, -1, len(scheduler.running), len(scheduler.waiting))
        else:
            probe.step_end(bool(result[1]))
        return result

    return step


# -- worker ---------------------------------------------------------------------------------------
def _wrap_worker_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        rank = getattr(self, "rank", None)
        # The probe is told where the model is (model_locator.py): the module-timing job hooks it.
        _attach_probe(self, ROLE_WORKER, rank, phase_scopes=worker_scopes(), model=lambda: worker_model(self))
        _attach_telemetry(self, ROLE_WORKER, rank, steps=True)

    return __init__


def _end_worker_step(probe, steps, has_work: bool, t0: int, scheduler_output) -> None:
    per_request = scheduler_output.num_scheduled_tokens
    batch, tokens = len(per_request), scheduler_output.total_num_scheduled_tokens
    t1 = time_ns() if steps is not None else 0  # shared with the flight recorder, as t0 is
    if probe is not None:
        if probe.ring is not None:  # the flight recorder keeps the prefill/decode split
            # A decoding request is scheduled one token; more is a prompt (or a chunk of one). As many
            # tokens as requests: all decode (most steps), no count needed. Else countOf runs in C
            # over the dict's values: no list, nothing per request in Python.
            decode = batch if tokens == batch else countOf(per_request.values(), 1)
            probe.step_end(has_work, batch, tokens, tokens - decode, decode, -1, -1, t1)
        else:
            probe.step_end(has_work)
    if steps is not None and has_work:
        steps.observe(t0, t1, batch, tokens)


def _wrap_execute_model(original):
    def execute_model(self, scheduler_output, *args, **kwargs):
        state = self.__dict__
        probe = state.get(PROBE_ATTR)
        steps = state.get(STEPS_ATTR)
        if probe is None and steps is None:
            return original(self, scheduler_output, *args, **kwargs)
        has_work = scheduler_output.total_num_scheduled_tokens > 0
        # One clock read for the step telemetry and the flight recorder both (0: telemetry off, the
        # recorder reads its own); so the telemetry's step includes the profiler's start, as the engine's does.
        t0 = time_ns() if steps is not None else 0
        if probe is not None:
            probe.step_begin(has_work, t0)
        result = original(self, scheduler_output, *args, **kwargs)
        if result is None:
            # Sampling is deferred to sample_tokens(): the step ends there.
            state[PENDING_ATTR] = (has_work, t0, scheduler_output)
        else:
            _end_worker_step(probe, steps, has_work, t0, scheduler_output)
        return result

    return execute_model


def _wrap_sample_tokens(original):
    def sample_tokens(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state = self.__dict__
        pending = state.pop(PENDING_ATTR, None)
        if pending is not None:
            _end_worker_step(state.get(PROBE_ATTR), state.get(STEPS_ATTR), *pending)
        return result

    return sample_tokens


# -- API server -----------------------------------------------------------------------------------
def _wrap_async_llm_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        logger = None
        try:
            from .stat_logger import attach_to_async_llm

            logger = attach_to_async_llm(self)
        except Exception as exc:
            log.warning("inference-sidecar: request telemetry not attached to the engine: %s", exc)
        # The API server's capture window ends in a capture span linked to the requests in flight.
        capture_spans = logger.captures if logger is not None else None
        on_report = capture_spans.on_report if capture_spans is not None else None
        probe = _attach_probe(self, ROLE_API_SERVER, None, loop=loop, on_capture_report=on_report,
                              phase_scopes=api_server_scopes(self))
        if probe is not None and logger is not None:
            logger.request_ring = probe.request_ring  # the flight recorder's finished requests
        if probe is not None:  # requests with X-Sidecar-Profile ask through this probe
            try:
                attach_request_captures(self, probe, capture_spans)
            except Exception as exc:
                log.warning("inference-sidecar: request-scoped captures are off: %s", exc)

    return __init__


PATCHES: tuple[patching.Patch, ...] = (
    ("vllm.v1.engine.core", "EngineCore", "__init__", _wrap_engine_init),
    ("vllm.v1.engine.core", "EngineCore", "step", _wrap_engine_step),
    ("vllm.v1.engine.core", "EngineCore", "step_with_batch_queue", _wrap_engine_step),
    ("vllm.v1.engine.core", "EngineCoreProc", "run_busy_loop", _wrap_engine_busy_loop),
    ("vllm.v1.worker.gpu_worker", "Worker", "__init__", _wrap_worker_init),
    ("vllm.v1.worker.gpu_worker", "Worker", "execute_model", _wrap_execute_model),
    ("vllm.v1.worker.gpu_worker", "Worker", "sample_tokens", _wrap_sample_tokens),
    ("vllm.v1.engine.async_llm", "AsyncLLM", "__init__", _wrap_async_llm_init),
)


def install() -> None:
    """Apply every patch (idempotent: vLLM may load plugins more than once per process)."""
    patching.install(PATCHES)
    capture_end.install()
