"""The named ranges of a step's phases in each vLLM process, switched on only while a capture records.

What vLLM 0.32 has and what this adds (the names and their phases are ``PHASE_RANGES`` in profile.py):

- **Worker**: vLLM's own scopes in ``GPUModelRunner.execute_model`` / ``sample_tokens`` (the CPU
  runner inherits them): ``gpu_model_runner: preprocess``, ``forward``, ``postprocess`` (the
  logits), ``sample``, ``bookkeep`` (the sampled tokens to the host). They go through
  ``record_function_or_nullcontext``, which enters a ``record_function`` only when
  ``VLLM_CUSTOM_SCOPES_FOR_PROFILING=1`` was set at start-up and a ``nullcontext`` otherwise: its
  choice is the module global ``_PROFILER_FUNC`` of vLLM's ``v1/utils.py``, which the switch sets to
  ``record_function`` while recording and puts back after. An environment variable cannot do it:
  with it set, every step would enter every scope, capture or not.
- **Engine core**: vLLM has scopes only inside the scheduler (``schedule: allocate_slots``, ...), none
  around the step's parts. The switch shadows, on the engine objects themselves (instance
  attributes), ``scheduler.schedule``, ``model_executor.execute_model``,
  ``EngineCore.capture_iteration_details`` (the context manager around the wait for the workers'
  output, in ``step`` and ``step_with_batch_queue`` alike) and ``scheduler.update_from_output`` with
  wrappers that enter a ``record_function``; switched off, the instance attributes are deleted and
  the class's methods are found again.
- **API server**: none in vLLM. ``input_processor.process_inputs`` (a request made into an
  ``EngineCoreRequest``) and ``output_processor.process_outputs`` (the engine's outputs made into
  responses, detokenisation included), shadowed the same way. Both run on the event loop's thread,
  the one the API server's window records. (Tokenisation by the renderer, awaited off that thread,
  is not inside either.)

Why instance attributes switched at the recording's edges: while no capture records nothing of this
exists, so an idle step costs exactly what it did (the hooks in hooks.py are unchanged); the switch
runs on the thread that runs the step (sidecar/probe/capture/profiler.py), between two steps, so no step sees
half of it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from sidecar.integration.method_ranges import MethodRanges, Target

log = logging.getLogger(__name__)

# Our own range names (vLLM's are in profile.py): "sidecar: " tells them from the engine's own.
SCHEDULE = "sidecar: schedule"
SEND_TO_WORKERS = "sidecar: send to workers"
WAIT_FOR_MODEL = "sidecar: wait for model"
UPDATE_FROM_OUTPUT = "sidecar: update from output"
PROCESS_INPUTS = "sidecar: process inputs"
PROCESS_OUTPUTS = "sidecar: process outputs"

# On vLLM's utils module: how many switches in this process have its scopes on, and what its choice
# was before the first (a process that runs the engine core and a worker has two switches).
_USERS_ATTR = "_inference_sidecar_scope_users"
_SAVED_ATTR = "_inference_sidecar_scope_saved"


class PhaseScopes:
    """One process's switch: ``(True)`` when recording starts, ``(False)`` before it stops (the
    probe's ``phase_scopes``). ``targets``: our ranges around the engine's methods
    (``MethodRanges``' targets); ``vllm_scopes``: whether vLLM's own scopes are switched on too."""

    def __init__(self, targets: Callable[[], list[Target]], vllm_scopes: bool) -> None:
        self._ranges = MethodRanges(targets)  # looked up when switched on: the engine's objects exist by then
        self._vllm_scopes = vllm_scopes
        self._scopes_on = False

    def __call__(self, on: bool, ranges: Callable[[str], Any] | None = None) -> None:
        """``ranges``: what each range enters, made from its name (None: torch's ``record_function``;
        an nsys capture gives NVTX ranges, sidecar/probe/capture/nsys.py)."""
        if on:
            self._on(ranges)
        else:
            self._off()

    def _on(self, ranges: Callable[[str], Any] | None = None) -> None:
        if self._ranges.on or self._scopes_on:
            return
        self._ranges(True, ranges)
        if self._vllm_scopes:
            if ranges is None:
                from torch.autograd.profiler import record_function as ranges

            _vllm_scopes_on(ranges)
            self._scopes_on = True

    def _off(self) -> None:
        self._ranges(False)
        if self._scopes_on:
            self._scopes_on = False
            _vllm_scopes_off()


def _vllm_utils():
    from vllm.v1 import utils

    return utils


def _vllm_scopes_on(record_function) -> None:
    utils = _vllm_utils()
    users = getattr(utils, _USERS_ATTR, 0)
    if users == 0:
        setattr(utils, _SAVED_ATTR, utils._PROFILER_FUNC)
        utils._PROFILER_FUNC = record_function
    setattr(utils, _USERS_ATTR, users + 1)


def _vllm_scopes_off() -> None:
    utils = _vllm_utils()
    users = getattr(utils, _USERS_ATTR, 0) - 1
    setattr(utils, _USERS_ATTR, max(users, 0))
    if users <= 0:
        # vLLM's own choice again (None: it chooses again at its next scope, from its environment).
        utils._PROFILER_FUNC = getattr(utils, _SAVED_ATTR, None)


def engine_core_scopes(core: Any) -> PhaseScopes:
    def targets():
        scheduler = getattr(core, "scheduler", None)
        return [
            (scheduler, "schedule", SCHEDULE, False),
            (getattr(core, "model_executor", None), "execute_model", SEND_TO_WORKERS, False),
            (core, "capture_iteration_details", WAIT_FOR_MODEL, True),
            (scheduler, "update_from_output", UPDATE_FROM_OUTPUT, False),
        ]

    return PhaseScopes(targets, vllm_scopes=True)


def worker_scopes() -> PhaseScopes:
    return PhaseScopes(lambda: [], vllm_scopes=True)  # vLLM's own scopes cover a worker's phases


def api_server_scopes(engine: Any) -> PhaseScopes:
    def targets():
        return [
            (getattr(engine, "input_processor", None), "process_inputs", PROCESS_INPUTS, False),
            (getattr(engine, "output_processor", None), "process_outputs", PROCESS_OUTPUTS, False),
        ]

    return PhaseScopes(targets, vllm_scopes=False)
