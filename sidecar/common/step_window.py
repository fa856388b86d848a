"""The step window of a job in one step-driven process: which working steps it records.

Every step-driven job (a torch.profiler capture, a hidden-sync scan) has the same life: **armed**
(the sidecar sent ``arm``), waiting for ``begin(start_step)``; **recording** exactly N working steps
from the first working step whose number is at or after ``start_step``; **finished**. Steps with no
work are neither recorded nor counted. A process the ``begin`` reached late starts at its next
working step; the sidecar names it in a capture's notes.

Two parts:

* ``schedule(first, steps)``: torch.profiler's ``schedule`` counterpart (torch/profiler/profiler.py),
  a pure function from a working step's number to what the job does with it. The probe numbers
  working steps (its count of working steps before this one), so the window is fixed once its
  first step is.
* ``StepWindow``: the base class of step-driven jobs. It applies the schedule on the engine's step
  thread (``on_step_begin`` / ``on_step_end``) and calls the job's hooks at each transition. Every
  transition happens on the step thread because torch.profiler must be stopped on the thread that
  started it; other threads only *request* a stop (``request_stop`` sets a reason), except that an
  armed job which never started can be cancelled from anywhere.
"""

from __future__ import annotations

import enum
import logging
import threading
from time import monotonic
from typing import Any, Callable

from .protocol import MAX_TEXT, P_ARMED, P_FAILED

log = logging.getLogger(__name__)

ARMED, RECORDING, FINISHED = "armed", "recording", "finished"


class Action(enum.Enum):
    NONE = "none"  # outside the window
    RECORD = "record"  # a working step inside the window
    RECORD_AND_STOP = "record_and_stop"  # the window's last working step: recording ends with it


def schedule(first: int, steps: int) -> Callable[[int], Action]:
    """The window that records ``steps`` working steps from working step ``first`` on, as a function
    of the working-step number (torch.profiler's ``RECORD`` / ``RECORD_AND_SAVE``)."""
    if steps < 1:
        raise ValueError(f"a window records at least one step, got steps={steps}")
    if first < 0:
        raise ValueError(f"working steps are numbered from 0, got first={first}")
    last = first + steps - 1

    def action(step: int) -> Action:
        if step < first or step > last:
            return Action.NONE
        return Action.RECORD_AND_STOP if step == last else Action.RECORD

    return action


def opens_at(start_step: int | None, step: int, has_work: bool) -> bool:
    """Whether a window opens at a step numbered ``step``: the first working step at or after the
    start step (None: the sidecar has not chosen one yet)."""
    return has_work and start_step is not None and step >= start_step


def clip(text: str) -> str:
    """``text`` cut to what the protocol carries (a longer error would make the sidecar reject the
    whole report)."""
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


class StepWindow:
    """A job recording one window of working steps; subclasses say what recording is.

    The probe calls ``on_step_begin(has_work, step)`` and ``on_step_end(did_work)`` around every
    engine step while the job is in its slot, with ``step`` the number of working steps the process
    completed before this one. Hooks, all on the step thread except ``_report_state``:

    * ``_start_recording()``: at the window's first step; raising fails the job (``OPEN_FAILED``).
    * ``_step_began(n, new)``: at the beginning of every working step in the window, ``n`` counted
      from 0 at the first; ``new`` is False when step ``n`` began before and did no work.
    * ``_step_ended()``: at the end of every step while recording.
    * ``_stop_recording()``: once, after the N-th working step or at the first step boundary after a
      stop request; reports the outcome.
    * ``_report_state(state, **fields)``: send one report (any thread).

    ``limit_time(seconds, reason)``: once recording, the window closes at the first step boundary
    after ``seconds`` with ``reason`` as its stop reason (one clock read per step while recording,
    none otherwise).
    """

    RECORDING_STATE = "recording"  # the state reported when recording starts
    OPEN_FAILED = "recording failed to start"
    CANCELLED = "no step recorded before the job ended"

    def __init__(self, steps: int) -> None:
        self._steps = steps
        self._lock = threading.Lock()  # uncontended except when a stop races a step
        self.state = ARMED
        self.start_step: int | None = None  # set by begin(); None: armed, waiting for the sidecar
        self.first_step: int | None = None  # the working step recording actually started at
        self._schedule: Callable[[int], Action] | None = None
        self._step = -1  # number of the step in progress, while recording
        self._marked = -1  # the last working step that began inside the window
        self._recorded = 0
        self._stop_reason: str | None = None
        self._time_limit: tuple[float, str] | None = None  # (seconds, stop reason) once recording starts
        self._deadline: float | None = None  # monotonic() at which recording must end

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    @property
    def steps_recorded(self) -> int:
        return self._recorded

    # -- called on the step thread -------------------------------------------------------------
    def on_step_begin(self, has_work: bool, step: int) -> None:
        if self._stop_reason is not None:
            self._close()
            return
        if self.state == ARMED:
            if not opens_at(self.start_step, step, has_work) or not self._open(step):
                return
        if self.state == RECORDING:
            self._step = step
            if has_work:
                new, self._marked = step > self._marked, step
                self._step_began(step - self.first_step, new)

    def on_step_end(self, did_work: bool) -> None:
        if self.state != RECORDING:
            return
        self._step_ended()
        step = self._step
        if did_work:
            self._recorded = step - self.first_step + 1
        if (did_work and self._schedule(step) is Action.RECORD_AND_STOP) or self._stop_reason is not None:
            self._close()
        elif self._deadline is not None and monotonic() >= self._deadline:
            self._stop_reason = self._time_limit[1]
            self._close()

    # -- called from any thread -------------------------------------------------------------------
    def limit_time(self, seconds: float, reason: str) -> None:
        """End recording at the first step boundary ``seconds`` after it began, with ``reason``."""
        self._time_limit = (seconds, reason)

    def report_armed(self, steps_seen: int, step_rate: float | None = None) -> None:
        """Tell the sidecar this process is armed, with its working-step count: the sidecar picks one
        start step for every process from these counts, ahead of them by a lead in time that
        ``step_rate`` (working steps per second lately; None: not known) turns into steps."""
        self._report_state(P_ARMED, steps_seen=steps_seen, step_rate=step_rate)

    def begin(self, start_step: int) -> None:
        """Record from working step ``start_step`` on (or from the next one, if it has passed)."""
        self.start_step = start_step

    def request_stop(self, reason: str) -> bool:
        """Ask the job to end early. Returns True if it ended now (it had not started)."""
        with self._lock:
            if self.state == FINISHED:
                return True
            self._stop_reason = reason
            cancelled = self.state == ARMED
            if cancelled:
                self.state = FINISHED
        if cancelled:
            self._fail(f"{self.CANCELLED} ({reason})")
        return cancelled

    # -- transitions ----------------------------------------------------------------------------
    def _open(self, first: int | None) -> bool:
        """Start recording at working step ``first`` (None: a job that is not step-driven)."""
        with self._lock:
            if self.state != ARMED:
                return False
            self.first_step = first
            try:
                self._schedule = schedule(first, self._steps) if first is not None else None
                self._start_recording()
                if self._time_limit is not None:
                    self._deadline = monotonic() + self._time_limit[0]
            except Exception as exc:  # the engine must keep serving whatever the recorder does
                self.state = FINISHED
                log.warning("inference-sidecar: %s: %s", self.OPEN_FAILED, exc)
                self._fail(f"{self.OPEN_FAILED}: {exc}")
                return False
            self.state = RECORDING
        self._report_state(self.RECORDING_STATE)
        return True

    def _close(self) -> None:
        with self._lock:
            if self.state == FINISHED:
                return
            was_recording = self.state == RECORDING
            self.state = FINISHED
        if was_recording:
            self._stop_recording()

    def _fail(self, error: str) -> None:
        self._report_state(P_FAILED, error=clip(error))

    # -- what a job does ------------------------------------------------------------------------
    def _start_recording(self) -> None:
        raise NotImplementedError

    def _step_began(self, n: int, new: bool) -> None:
        pass

    def _step_ended(self) -> None:
        pass

    def _stop_recording(self) -> None:
        raise NotImplementedError

    def _report_state(self, state: str, **fields: Any) -> None:
        raise NotImplementedError
