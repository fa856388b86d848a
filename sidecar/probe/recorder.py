"""Record exactly N working steps of one process with torch.profiler.

torch.profiler must be started and stopped on the thread whose operators it records (stopping it
from another thread crashes the process), so every transition of a step-driven capture happens on the
engine's step thread, inside ``on_step_begin`` / ``on_step_end``. Other threads only *request*
(``request_stop``); an armed capture that never started can be cancelled from anywhere.

Steps with no work (an engine step with nothing scheduled) are not counted. Every process of an
engine counts the same working steps, so the sidecar aligns a capture across processes by giving each
the same start step (``begin(start_step)``), chosen ahead of every process's current count.

Each counted step is
one ``ProfilerStep#<n>`` annotation, torch.profiler's own: ``start()`` opens #0 at the beginning of
the first counted step, ``step()`` at the beginning of each later counted step opens the next one,
and ``stop()`` at the end of the N-th counted step closes the last. Idle time between counted steps
falls inside the previous annotation, as in any torch.profiler schedule.

Export (``export_chrome_trace`` to plain JSON) runs on a separate thread. It still holds the GIL
while Kineto serialises (about 1.3 µs per event, measured), so compression and merging are left to
the sidecar process; see docs/architecture.md.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Executor
from typing import Any, Callable

from ..protocol import P_CAPTURING, P_DONE, P_EXPORTING, P_FAILED, CaptureSpec

log = logging.getLogger(__name__)

Report = Callable[[dict[str, Any]], None]

ARMED, RECORDING, FINISHED = "armed", "recording", "finished"


def make_profiler(spec: CaptureSpec, cuda_available: bool):
    """A torch.profiler.profile that records every step it is given (start/step/stop by hand)."""
    import torch.profiler as tp

    wanted = spec.activities or (("cpu", "cuda") if cuda_available else ("cpu",))
    acts = [tp.ProfilerActivity.CPU if a == "cpu" else tp.ProfilerActivity.CUDA for a in wanted]
    return tp.profile(
        activities=acts,
        # A schedule makes torch emit its ProfilerStep#<n> annotations; always RECORD so that
        # start/step/stop alone decide what is recorded.
        schedule=lambda _step: tp.ProfilerAction.RECORD,
        record_shapes=spec.record_shapes,
        with_stack=spec.with_stack,
        profile_memory=spec.profile_memory,
        with_flops=spec.with_flops,
    )


class StepCapture:
    """One capture in one step-driven process (engine core, worker)."""

    def __init__(
        self,
        spec: CaptureSpec,
        trace_path: str,
        report: Report,
        exporter: Executor,
        cuda_available: bool = False,
    ) -> None:
        self.spec = spec
        self.trace_path = trace_path
        self._report = report
        self._exporter = exporter
        self._cuda = cuda_available
        self._lock = threading.Lock()  # uncontended except when a stop/cancel races a step
        self.state = ARMED
        self._prof = None
        self.start_step: int | None = None  # set by begin(); None: armed, waiting for the sidecar
        self.first_step: int | None = None  # the step index recording actually started at
        self._recorded = 0
        self._last_counted = False  # did the previous step count? then this working step opens a new ProfilerStep
        self._stop_reason: str | None = None
        self._started_at = 0.0

    # -- called on the step thread -------------------------------------------------------------
    def on_step_begin(self, has_work: bool, index: int) -> None:
        """``index``: working steps this process completed before this one (its step number)."""
        if self._stop_reason is not None:
            self._finish_on_step_thread()
            return
        if self.state == ARMED:
            start = self.start_step
            if has_work and start is not None and index >= start:
                self.first_step = index
                self._start()
        elif self.state == RECORDING and has_work and self._last_counted:
            self._prof.step()
            self._last_counted = False

    def on_step_end(self, did_work: bool) -> None:
        if self.state != RECORDING:
            return
        if did_work:
            self._recorded += 1
            self._last_counted = True
        if self._recorded >= self.spec.steps or self._stop_reason is not None:
            self._finish_on_step_thread()

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    # -- called from any thread -------------------------------------------------------------------
    def begin(self, start_step: int) -> None:
        """Record from working step ``start_step`` on (or from the next one, if it has passed)."""
        self.start_step = start_step

    def request_stop(self, reason: str) -> bool:
        """Ask the capture to end early. Returns True if it ended now (it had not started)."""
        with self._lock:
            if self.state == FINISHED:
                return True
            self._stop_reason = reason
            if self.state == ARMED:
                self.state = FINISHED
                cancelled = True
            else:
                cancelled = False
        if cancelled:
            self._send(P_FAILED, error=f"no step recorded before the capture ended ({reason})")
        return cancelled

    def abandon(self, error: str) -> None:
        """Give up after an unexpected error on the step path; report it, leave the engine alone."""
        with self._lock:
            self.state = FINISHED
        prof, self._prof = self._prof, None
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass
        self._send(P_FAILED, error=error)

    # -- internals ------------------------------------------------------------------------------
    def _start(self) -> None:
        with self._lock:
            if self.state != ARMED:
                return
            try:
                self._prof = make_profiler(self.spec, self._cuda)
                self._prof.start()
            except Exception as exc:  # the engine must keep serving whatever the profiler does
                self.state = FINISHED
                log.warning("inference-sidecar: profiler failed to start: %s", exc)
                self._send(P_FAILED, error=f"profiler failed to start: {exc}")
                return
            self.state = RECORDING
            self._started_at = time.time()
        self._send(P_CAPTURING)

    def _finish_on_step_thread(self) -> None:
        with self._lock:
            if self.state == FINISHED:
                return
            was_recording = self.state == RECORDING
            self.state = FINISHED
        if not was_recording:
            return
        prof, self._prof = self._prof, None
        try:
            prof.stop()
        except Exception as exc:
            log.warning("inference-sidecar: profiler failed to stop: %s", exc)
            self._send(P_FAILED, error=f"profiler failed to stop: {exc}")
            return
        self._send(P_EXPORTING)
        self._exporter.submit(self._export, prof)

    def _export(self, prof) -> None:
        try:
            os.makedirs(os.path.dirname(self.trace_path), exist_ok=True)
            prof.export_chrome_trace(self.trace_path)
            size = os.path.getsize(self.trace_path)
        except Exception as exc:
            log.warning("inference-sidecar: trace export failed: %s", exc)
            self._send(P_FAILED, error=f"trace export failed: {exc}")
            return
        self._send(P_DONE, file=self.trace_path, bytes=size)

    def _send(self, state: str, **fields: Any) -> None:
        msg = {
            "type": "capture",
            "capture_id": self.spec.id,
            "state": state,
            "steps_recorded": self._recorded,
            **fields,
        }
        if self.first_step is not None:
            msg["first_step"] = self.first_step
        if self._stop_reason is not None:
            msg["stop_reason"] = self._stop_reason
        self._report(msg)


class WindowCapture(StepCapture):
    """One capture in a process without forward steps (the API server).

    It records from ``arm`` (sent to every process at once) until the sidecar sends ``stop``, when
    the last step-driven process has finished. Start and stop run on
    the process's asyncio loop thread, the thread whose work is worth recording.
    """

    def __init__(self, spec, trace_path, report, exporter, loop, cuda_available=False) -> None:
        super().__init__(spec, trace_path, report, exporter, cuda_available)
        self._loop = loop

    def start_window(self) -> None:
        self._loop.call_soon_threadsafe(self._start)

    def request_stop(self, reason: str) -> bool:
        self._stop_reason = reason
        self._loop.call_soon_threadsafe(self._finish_on_step_thread)
        return False
