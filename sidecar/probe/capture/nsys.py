"""A capture for Nsight Systems (``backend=nsys``): the same aligned window of N working steps, marked
for an ``nsys`` that already runs the engine, instead of recorded by torch.profiler.

The engine is launched under ``nsys launch --capture-range=cudaProfilerApi`` (docs/gpu.md): nsys
collects only between a process's ``cudaProfilerStart`` and ``cudaProfilerStop``. At the window's
first working step (the start step the sidecar aligned across processes, as for any capture) this
job calls ``cudaProfilerStart`` and, after the N-th working step (or at the first step boundary
after a stop request, the time limit or a probe error), ``cudaProfilerStop``, both on the engine's
step thread. While the window is open it pushes one NVTX range per step, ``step <n>`` (``n``: the
working step's number, the same in every process of the engine), from the step's begin to its end,
and hands the engine's phase switch (``phase_scopes``, the same switch and range names as a torch
capture's, sidecar/integration/method_ranges.py) an NVTX range in place of torch's
``record_function``: each phase range is named ``<phase> (<range name>)``, with the phase of the
profile's table (sidecar/common/phases.py). So the Nsight timeline shows the steps and phases a
capture's analysis shows. Outside the window nothing of this exists: no NVTX call, no wrapper.

``cudaProfilerStart`` goes through the CUDA runtime, which creates a context where the process has
none yet (hundreds of MiB of device memory, seconds): only a process whose CUDA is already
initialised (a worker that runs the model) calls it; another (an engine core on a GPU host) pushes
its NVTX ranges only, and its report says so (``cuda_profiler`` false).

No trace file is written: the report lands where nsys writes it (the ``-o`` of ``nsys launch`` /
``nsys start``, on the engine's host). The CUDA and NVTX calls go through ``CudaCalls`` (one object,
four methods), so that tests record their exact sequence on a host without CUDA.
"""

from __future__ import annotations

import inspect
import logging
import threading
from time import perf_counter_ns
from typing import Any, Callable, Protocol

from ...common.protocol import P_CAPTURING, P_DONE, P_EXPORTING, CaptureReport, CaptureSpec
from ...common.step_window import FINISHED, StepWindow
from .limits import ProbeLimits

log = logging.getLogger(__name__)

Report = Callable[[CaptureReport], None]
STEP_RANGE = "step {}"  # the NVTX range of one working step: "step 1234"


class CudaCalls(Protocol):
    """What an nsys capture calls: the CUDA profiler API and NVTX's push/pop (one thread's stack)."""

    def has_context(self) -> bool: ...  # CUDA is initialised here: cudaProfilerStart creates no context

    def start(self) -> None: ...  # cudaProfilerStart

    def stop(self) -> None: ...  # cudaProfilerStop

    def push(self, name: str) -> None: ...  # nvtxRangePushA

    def pop(self) -> None: ...  # nvtxRangePop


class TorchCudaCalls:
    """``CudaCalls`` through torch: ``torch.cuda.profiler.start/stop`` and ``torch.cuda.nvtx``. Each
    is one C call; imported once, when the capture is armed (link thread)."""

    def __init__(self) -> None:
        import torch
        import torch.cuda.nvtx as nvtx
        import torch.cuda.profiler as profiler

        try:  # a build without CUDA has a stub that raises at every call: say so at arm
            from torch._C import _nvtx  # noqa: F401
        except ImportError:
            raise RuntimeError("this torch build has no NVTX (a CPU-only build): nothing for nsys to show") from None
        self._torch = torch
        self.start, self.stop = profiler.start, profiler.stop
        self.push, self.pop = nvtx.range_push, nvtx.range_pop

    def has_context(self) -> bool:
        return bool(self._torch.cuda.is_initialized())


class _Range:
    """One NVTX range as a context manager: what ``record_function(name)`` is to a torch capture."""

    __slots__ = ("_calls", "_name")

    def __init__(self, calls: CudaCalls, name: str) -> None:
        self._calls, self._name = calls, name

    def __enter__(self) -> None:
        self._calls.push(self._name)

    def __exit__(self, *exc: Any) -> None:
        self._calls.pop()


def phase_range_name(range_name: str, phase_table: dict[str, str] | None) -> str:
    """The NVTX name of one of the engine's phase ranges: ``forward (gpu_model_runner: forward)``."""
    phase = (phase_table or {}).get(range_name)
    return f"{phase} ({range_name})" if phase else range_name


def takes_ranges(switch: Callable[..., None]) -> bool:
    """Whether an engine's phase switch takes ``ranges=`` (sidecar/integration/method_ranges.py):
    what each range enters, here NVTX's. One without it enters torch's ``record_function`` only."""
    try:
        params = inspect.signature(switch).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): not known to take it
        return False
    return any(p.name == "ranges" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


class NsysCapture(StepWindow):
    """One nsys capture in one step-driven process (module docstring)."""

    RECORDING_STATE = P_CAPTURING
    OPEN_FAILED = "nsys range failed to start"
    CANCELLED = "no step recorded before the capture ended"

    def __init__(self, spec: CaptureSpec, report: Report, calls: CudaCalls, limits: ProbeLimits | None = None,
                 phase_scopes: Callable[..., None] | None = None, phase_table: dict[str, str] | None = None) -> None:
        super().__init__(spec.steps)
        self.spec = spec
        self.stacks = "none"
        self._report = report
        self._calls = calls
        self._phase_scopes = phase_scopes
        self._phase_table = phase_table
        if limits is not None:
            self.limit_time(limits.max_capture_s, limits.duration_reason)
        self._profiler_on = False  # cudaProfilerStart called and not yet stopped
        self._used_profiler = False  # this process called cudaProfilerStart (it has a CUDA context)
        self._step_open = False  # a step's NVTX range is pushed
        self._phases_on = False
        self._phase_note: str | None = None  # why the phases have no ranges, when they have none
        self._step_ranges = 0
        self._recording_thread: int | None = None
        self._on_step_thread_ns = 0

    # -- the window's hooks (step thread) ----------------------------------------------------------
    def _start_recording(self) -> None:
        began = perf_counter_ns()
        self._recording_thread = threading.get_ident()
        if self._calls.has_context():
            self._calls.start()
            self._profiler_on = self._used_profiler = True
        self._switch_phases(True)
        self._on_step_thread_ns += perf_counter_ns() - began

    def _step_began(self, n: int, new: bool) -> None:
        if self._step_open:  # a step began again with no end in between: never leave one pushed
            self._calls.pop()
        self._calls.push(STEP_RANGE.format(self.first_step + n))
        self._step_open = True
        self._step_ranges += new

    def _step_ended(self) -> None:
        if self._step_open:
            self._step_open = False
            self._calls.pop()

    def _stop_recording(self) -> None:
        began = perf_counter_ns()
        problem = self._close_all()
        self._on_step_thread_ns += perf_counter_ns() - began
        if problem is not None:
            self._fail(problem)
            return
        # The sidecar's table of a capture's process states (service/jobs/states.py) passes through
        # "exporting" to "done": here there is nothing to export, the range is closed.
        self._report_state(P_EXPORTING)
        self._report_state(P_DONE)

    def end_now(self, reason: str) -> None:
        """As ``StepCapture.end_now``: on the step thread between steps, the window closes now."""
        if self.request_stop(reason):
            return
        if threading.get_ident() == self._recording_thread:
            self._close()

    def abandon(self, error: str) -> None:
        """After an unexpected error on the step path: every range popped, the profiler stopped."""
        with self._lock:
            self.state = FINISHED
        self._close_all()
        self._fail(error)

    def _close_all(self) -> str | None:
        """Pop what is pushed, switch the phases off, stop the CUDA profiler: whatever raises, the
        rest still runs. The first problem (None: none)."""
        problems = []
        for undo in (self._step_ended, lambda: self._switch_phases(False), self._stop_profiler):
            try:
                undo()
            except Exception as exc:
                self._step_open = False
                problems.append(str(exc))
        return f"nsys range did not close cleanly: {problems[0]}" if problems else None

    def _stop_profiler(self) -> None:
        if self._profiler_on:
            self._profiler_on = False
            self._calls.stop()

    def _switch_phases(self, on: bool) -> None:
        scopes = self._phase_scopes
        if scopes is None or on == self._phases_on:
            return
        if on and not takes_ranges(scopes):  # it would enter torch's record_function: nothing for nsys
            self._phase_note = "this engine's phase switch takes no ranges= (only torch's record_function): no NVTX phases"
            log.warning("inference-sidecar: capture %s: %s", self.spec.id, self._phase_note)
            return
        try:
            if on:
                table, calls = self._phase_table, self._calls
                scopes(True, ranges=lambda name: _Range(calls, phase_range_name(name, table)))
            else:
                scopes(False)
            self._phases_on = on
        except Exception as exc:  # the ranges are a bonus: the steps are still marked
            self._phase_note = f"phase ranges not switched {'on' if on else 'off'}: {exc}"
            log.warning("inference-sidecar: capture %s: %s", self.spec.id, self._phase_note)
            if on:  # whatever a switch that failed half-way put in comes out again
                try:
                    scopes(False)
                except Exception:
                    pass

    def _report_state(self, state: str, **fields: Any) -> None:
        nsys = {"cuda_profiler": self._used_profiler, "step_ranges": self._step_ranges,
                "phase_ranges": self._phase_scopes is not None and self._phase_note is None}
        if self._phase_note is not None:
            nsys["phase_note"] = self._phase_note
        self._report(CaptureReport(
            job_id=self.spec.id, state=state, steps_recorded=self._recorded, first_step=self.first_step,
            stop_reason=self._stop_reason, stacks="none", nsys=nsys,
            step_thread_ms=round(self._on_step_thread_ns / 1e6, 3), **fields))
