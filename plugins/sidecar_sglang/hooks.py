"""Patches that put a probe on SGLang's step path (the versions in ``profile.SUPPORTED_VERSIONS``).

SGLang's scheduler process runs the model too, so it is the one step-driven process (one per TP
rank). Its event loops (normal, overlap, PP, disaggregation, ...) are ``while True`` loops, not
wrappable as a step; every variant calls two methods once per iteration, which bound the step:

- ``Scheduler.get_next_batch_to_run`` entry: the step begins, if the pass may have work: an
  over-estimate read before scheduling (requests waiting or running, a chunked prefill, a last batch
  to merge), because a working step must be announced at its beginning to be recorded; the plan's
  ``batch_to_run`` then says whether it did work (a step announced with work that did none is not
  counted). A pass with nothing at all takes no step: the idle loop polls, thousands of times a second.
- the next ``Scheduler.ingest_requests`` entry: the step ends (the batch ran and, in overlap mode,
  the previous batch's result was processed).

So a step includes scheduling, the forward launch and result processing. In overlap mode (SGLang's
default) the device time of batch N is paid in step N+1, when its result is synchronised.

- ``Scheduler.__init__``: the scheduler's probe and step telemetry (SGLang loads plugins in
  ``run_scheduler_process`` before building the ``Scheduler``); TP rank 0's probe also answers for the
  requests in flight (requests_view.py). Its phase ranges are SGLang's own (profile.py).
- ``TokenizerManager.auto_create_handle_loop``: the HTTP server process, a window role, instrumented
  with ``sidecar.instrument`` (probe, process telemetry, request telemetry). Its probe needs the
  event loop its captures record on, which SGLang creates there, on the first request. Its phase
  ranges are the plugin's, switched on only while a capture records (``http_server_ranges``).
- ``TokenizerManager._handle_batch_output``: each finished request's spans and metrics (requests.py).

Each patch is independent (``sidecar.integration.patching``): one that fails is logged and the others
still apply. A failure inside a hook is logged once per object and SGLang goes on untouched.
"""

from __future__ import annotations

import inspect
import logging
import multiprocessing
import sys
import time

from sidecar.integration import attach, patching
from sidecar.integration.attach import PROBE_ATTR, STEPS_ATTR
from sidecar.integration.method_ranges import MethodRanges

from .profile import (PROCESS_INPUTS, PROCESS_OUTPUTS, ROLE_API_SERVER, ROLE_SCHEDULER, SGLANG_PROFILE,
                      SUPPORTED_VERSIONS)
from .requests import INSTRUMENT_ATTR, wrap_handle_batch_output
from .requests_view import requests_in_flight

log = logging.getLogger(__name__)

STEP_ATTR = "_inference_sidecar_step"  # the open step: (t0_ns, did_work, batch, tokens, prefill, decode)
FAILED_ATTR = "_inference_sidecar_hook_failed"  # a hook failed once on this object: logged, not again
_MISSING = object()
_UNKNOWN = (-1, -1, -1, -1)


def _log_once(obj, what: str, exc: BaseException) -> None:
    state = obj.__dict__
    if not state.get(FAILED_ATTR):
        state[FAILED_ATTR] = True
        log.warning("inference-sidecar: %s failed (%s: %s); the SGLang step goes on without it",
                    what, type(exc).__name__, exc)


def _tp_rank() -> int | None:
    """This scheduler's tensor-parallel rank (SGLang's process-wide parallel context)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().tp_rank)
    except Exception:
        return None


# -- scheduler ------------------------------------------------------------------------------------
def _attach_scheduler(scheduler):
    rank = _tp_rank()
    # The requests in flight (requests_view.py), from one scheduler only: every TP rank holds the same
    # requests, and the heartbeats' counts are summed over processes.
    in_flight = (lambda: requests_in_flight(scheduler)) if not rank else None
    probe = attach.attach_probe(scheduler, SGLANG_PROFILE, ROLE_SCHEDULER, rank, in_flight=in_flight)
    attach.attach_telemetry(scheduler, SGLANG_PROFILE, ROLE_SCHEDULER, rank, steps=True)
    return probe


def _wrap_scheduler_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _attach_scheduler(self)

    return __init__


def _has_work(scheduler) -> bool:
    """Before scheduling: might this iteration run a batch? Over-estimates (safe: a step announced
    with work that does none is not counted); never under-estimates, or its step would go unrecorded."""
    return bool(
        scheduler.waiting_queue
        or not scheduler.running_batch.is_empty()
        or scheduler.last_batch is not None
        or scheduler.chunked_req is not None
    )


def batch_counts(batch) -> tuple[int, int, int, int]:
    """(requests, tokens, prefill tokens, decode tokens) of a planned ``ScheduleBatch``; -1: unknown.

    Decode: one token per request (more with speculative decoding, not counted here). Extend
    (prefill): ``extend_num_tokens``. Mixed (chunked prefill + decode): the running requests ride
    along as one-token extends and are listed in ``decoding_reqs``."""
    requests = len(batch.reqs)
    mode = batch.forward_mode
    if mode.is_decode():
        return requests, requests, 0, requests
    if mode.is_mixed():
        tokens = batch.extend_num_tokens or 0
        decode = len(batch.decoding_reqs or ())
        return requests, tokens, tokens - decode, decode
    if mode.is_extend():
        tokens = batch.extend_num_tokens or 0
        return requests, tokens, tokens, 0
    return requests, -1, -1, -1


def _wrap_get_next_batch_to_run(original):
    def get_next_batch_to_run(self, *args, **kwargs):
        state = self.__dict__
        probe = state.get(PROBE_ATTR, _MISSING)
        if probe is _MISSING:  # built before the patches applied: attach on first use
            probe = _attach_scheduler(self)
        steps = state.get(STEPS_ATTR)
        if probe is None and steps is None:
            return original(self, *args, **kwargs)
        try:
            has_work = _has_work(self)
        except Exception as exc:  # another SGLang's attributes: assume work (safe, see _has_work)
            _log_once(self, "reading the scheduler's queues", exc)
            has_work = True
        if not has_work:
            # An idle pass. SGLang's loop polls rather than blocks (thousands of passes a second
            # when idle): counted as steps they would flood the flight recorder, so, like an
            # engine that blocks while idle, it takes no step.
            return original(self, *args, **kwargs)
        t0 = time.time_ns() if steps is not None else 0
        if probe is not None:
            probe.step_begin(True)
        # Ended at the next ingest_requests even if scheduling raises.
        state[STEP_ATTR] = (t0, False, *_UNKNOWN)
        plan = original(self, *args, **kwargs)
        batch = plan.batch_to_run
        if batch is not None:
            counts = _UNKNOWN
            if steps is not None or (probe is not None and probe.ring is not None):
                try:
                    counts = batch_counts(batch)
                except Exception as exc:
                    _log_once(self, "reading the scheduled batch", exc)
            state[STEP_ATTR] = (t0, True, *counts)
        return plan

    return get_next_batch_to_run


def _end_step(scheduler, step) -> None:
    t0, did_work, batch, tokens, prefill, decode = step
    state = scheduler.__dict__
    probe = state.get(PROBE_ATTR)
    if probe is not None:
        if probe.ring is not None:  # the flight recorder keeps the scheduler's queue lengths
            try:
                running, waiting = len(scheduler.running_batch.reqs), len(scheduler.waiting_queue)
            except Exception as exc:
                _log_once(scheduler, "reading the scheduler's queues", exc)
                running = waiting = -1
            probe.step_end(did_work, batch, tokens, prefill, decode, running, waiting)
        else:
            probe.step_end(did_work)
    steps = state.get(STEPS_ATTR)
    if steps is not None and did_work:
        steps.observe(t0, time.time_ns(), max(batch, 0), max(tokens, 0))


def _wrap_ingest_requests(original):
    def ingest_requests(self, *args, **kwargs):
        step = self.__dict__.pop(STEP_ATTR, None)
        if step is not None:
            _end_step(self, step)
        return original(self, *args, **kwargs)

    return ingest_requests


# -- HTTP server (TokenizerManager) ---------------------------------------------------------------
def _wrap_auto_create_handle_loop(original):
    def auto_create_handle_loop(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        # Called on every request: after the first, one dict lookup.
        if INSTRUMENT_ATTR not in self.__dict__:
            loop = getattr(self, "event_loop", None)
            if loop is not None:
                _instrument_http_server(self, loop)
        return result

    return auto_create_handle_loop


def http_server_ranges(manager) -> MethodRanges:
    """The HTTP server's phase ranges, entered only while a capture records: input processing
    (``_tokenize_one_request``: a request tokenized into the scheduler's input; where it awaits, as
    for multimodal data, what the event loop runs meanwhile is inside) and output processing
    (``_handle_batch_output``: a batch of the detokenizer's outputs made into responses; it only
    yields to the loop between groups of the requests it wakes, whose handlers then run inside)."""
    return MethodRanges(lambda: [(manager, "_tokenize_one_request", PROCESS_INPUTS),
                                 (manager, "_handle_batch_output", PROCESS_OUTPUTS)])


def _instrument_http_server(manager, loop) -> None:
    """The HTTP server's probe (its captures record on ``loop``, with its phase ranges), process
    telemetry and request telemetry (requests.py), through the engine-agnostic ``sidecar.instrument``.
    It reports no requests in flight: the scheduler does (requests_view.py)."""
    from sidecar import instrument

    inst = instrument(SGLANG_PROFILE, role=ROLE_API_SERVER, loop=loop,
                      model=str(getattr(manager, "served_model_name", "") or ""),
                      phase_scopes=http_server_ranges(manager), in_flight=None)
    manager.__dict__[INSTRUMENT_ATTR] = inst if inst.enabled else None
    manager.__dict__[PROBE_ATTR] = inst.probe


SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
TOKENIZER_MODULE = "sglang.srt.managers.tokenizer_manager"

PATCHES: tuple[patching.Patch, ...] = (
    (SCHEDULER_MODULE, "Scheduler", "__init__", _wrap_scheduler_init),
    (SCHEDULER_MODULE, "Scheduler", "get_next_batch_to_run", _wrap_get_next_batch_to_run),
    (SCHEDULER_MODULE, "Scheduler", "ingest_requests", _wrap_ingest_requests),
    (TOKENIZER_MODULE, "TokenizerManager", "auto_create_handle_loop", _wrap_auto_create_handle_loop),
    (TOKENIZER_MODULE, "TokenizerManager", "_handle_batch_output", wrap_handle_batch_output),
)


def _wanted(module: str) -> bool:
    """Patch a module only in the process that uses it, so that no process imports more of SGLang
    than it would anyway. A scheduler process has imported the scheduler module when SGLang loads
    plugins (``run_scheduler_process`` lives there). The HTTP server is the main process and loads
    plugins before it imports anything (launch_server's ``__main__``): there the tokenizer manager is
    imported now, as SGLang's engine module would a moment later. The detokenizer imports neither.
    Called outside SGLang (no plugin loader imported), nothing is imported or patched."""
    if module in sys.modules:
        return True
    return (module == TOKENIZER_MODULE and "sglang.srt.plugins" in sys.modules
            and multiprocessing.parent_process() is None)


def _step_pair_matches() -> bool:
    """The scheduler's step boundaries are the ones the hooks expect (0.5.20+): ``ingest_requests``
    and ``get_next_batch_to_run(running_batch, last_batch) -> NextBatchPlan``. On an older SGLang
    patching only one of them would open steps that never end, or read a plan that is a batch."""
    try:
        scheduler = sys.modules[SCHEDULER_MODULE].Scheduler
        if "ingest_requests" not in scheduler.__dict__:
            return False
        method = inspect.unwrap(scheduler.__dict__["get_next_batch_to_run"])  # under SGLang's decorators
        return method.__code__.co_varnames[:3] == ("self", "running_batch", "last_batch")
    except Exception:
        return False


def install() -> None:
    """Apply the patches this process needs (idempotent: SGLang may load plugins more than once)."""
    patches = [p for p in PATCHES if _wanted(p[0])]
    if any(p[0] == SCHEDULER_MODULE for p in patches) and not _step_pair_matches():
        log.warning("inference-sidecar: this SGLang's scheduler loop is not one the plugin supports "
                    "(supported: SGLang %s); its steps are not instrumented", ", ".join(SUPPORTED_VERSIONS))
        patches = [p for p in patches if p[0] != SCHEDULER_MODULE]
    patching.install(patches)
