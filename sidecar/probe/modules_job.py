"""The module-timing job in one process: every ``nn.Module`` of its model timed for N working steps.

A step window (sidecar/common/step_window.py), as a capture and a sync scan are: armed, it waits for the
sidecar's ``begin(start_step)``; at the beginning of the window's first working step it puts a
``ModuleTimer``'s hooks on the model (sidecar/probe/modules_timer.py), and at the end of the N-th (or at the
first step boundary after a stop) it takes every one of them out, both on the engine's step thread,
between two forwards, so no forward ever runs half hooked. Counting the hooks before and after is
part of the report: equal counts say the job left nothing behind. The table is built on the probe's
export thread (on CUDA that is where the timing events are waited for), never on the step thread.

Where the model is comes from the engine integration (``Probe(model=...)``: a callable, read when the
window opens, since an engine builds its model after its worker); no model there yet fails the job
at its first step, with the engine untouched.
"""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from typing import Any, Callable

from .modules_timer import ModuleTimer, hook_count
from ..common.protocol import P_DONE, P_TIMING, ModuleReport, ModuleRow, ModuleSpec
from ..common.cuda_graphs import GraphReplays
from ..common.step_window import StepWindow

log = logging.getLogger(__name__)

Report = Callable[[ModuleReport], None]


class ModuleTiming(StepWindow):
    RECORDING_STATE = P_TIMING
    OPEN_FAILED = "module hooks failed to go in"
    CANCELLED = "no step timed before the job ended"

    def __init__(self, spec: ModuleSpec, report: Report, model: Callable[[], Any], exporter: Executor,
                 cuda: bool = False, graphs: GraphReplays | None = None) -> None:
        """``graphs``: counts the engine's CUDA graph replays in the window (default: torch's class): a
        replay runs no forward hook, so the report says in how many steps the model ran unseen."""
        super().__init__(spec.steps)
        self._graphs = graphs if graphs is not None else GraphReplays()
        self.spec = spec
        self._report = report
        self._locate = model
        self._exporter = exporter
        self._cuda = cuda
        self._model: Any = None
        self._timer: ModuleTimer | None = None
        self._hooks_before = 0

    # -- the window's hooks (step thread) ----------------------------------------------------------
    def _start_recording(self) -> None:
        model = self._locate()
        if model is None:
            raise RuntimeError("this process has no model loaded yet")
        self._model = model
        self._hooks_before = hook_count(model)
        timer = ModuleTimer(model, cuda=self._cuda)
        try:
            timer.install()
        except Exception:
            timer.remove()  # the hooks that went in come out again
            raise
        self._timer = timer
        try:
            self._graphs.install()
        except Exception as exc:  # no count of replays: the timing goes on
            log.warning("inference-sidecar: CUDA graph replays not counted: %s", exc)

    def _step_began(self, n: int, new: bool) -> None:
        self._graphs.step_began()

    def _step_ended(self) -> None:
        self._graphs.step_ended()

    def _stop_recording(self) -> None:
        self._graphs.uninstall()
        timer, self._timer = self._timer, None
        try:  # nothing of this may reach the engine's step
            timer.remove()
            hooks_after = hook_count(self._model)
            self._exporter.submit(self._finish, timer, hooks_after)
        except Exception as exc:
            log.warning("inference-sidecar: module timing %s did not end cleanly: %s", self.spec.id, exc)
            self._fail(f"module timing did not end cleanly: {exc}")

    # -- the export thread -------------------------------------------------------------------------
    def _finish(self, timer: ModuleTimer, hooks_after: int) -> None:
        try:
            rows = [ModuleRow(**row) for row in timer.rows()]
        except Exception as exc:
            log.warning("inference-sidecar: module timing %s: %s", self.spec.id, exc)
            self._fail(f"module times not read: {exc}")
            return
        self._report_state(P_DONE, rows=rows, hooks_before=self._hooks_before, hooks_after=hooks_after,
                           graph_steps=self._graphs.steps, graph_replays=self._graphs.replays)

    def _report_state(self, state: str, **fields: Any) -> None:
        self._report(ModuleReport(
            job_id=self.spec.id, state=state, steps_recorded=self._recorded, first_step=self.first_step,
            stop_reason=self._stop_reason, clock="cuda" if self._cuda else "cpu", **fields))
