"""Record exactly N working steps of one process with torch.profiler.

Which steps a capture records, and on which thread each transition happens, is the job window's
(sidecar/common/step_window.py): armed, then exactly N working steps from the first working step at or after the
sidecar's ``begin(start_step)``, every start/step/stop on the engine's step thread (torch.profiler
must be stopped on the thread that started it: another thread crashes the process). Every process
of an engine counts the same working steps, so one start step, chosen ahead of every process's
current count, aligns a capture across processes.

Each counted step is one ``ProfilerStep#<n>`` annotation, torch.profiler's own: ``start()`` opens #0
at the beginning of the first counted step, ``step()`` at the beginning of each later counted step
opens the next one, and ``stop()`` at the end of the N-th counted step closes the last. Idle time
between counted steps falls inside the previous annotation, as in any torch.profiler schedule.

So no annotation is cut off: each opens at a step's begin, and the last closes at a step boundary
(the N-th step's end; after a stop request or the time limit, the first boundary after it), never
inside a step. The last holds no idle time after its step and may be much shorter than the others
(a loaded host, a worker that waits between steps), which the analysis would otherwise take for a
step cut off where recording stopped. The trace says so itself: ``whole_steps`` in its
``inference_sidecar`` member (sidecar/common/phases.py ``WHOLE_STEPS_KEY``), written with the phase table at
the start, so that a trace recorded in parts (``records_in_parts``, trace_parts.py) has it in its
first part's header, which the join keeps. One case would break it: a window that ends right after
a step announced with work that did none (a stop request then), whose annotation holds no working
step. Recorded in one session, the member is written again before ``stop()`` with ``whole_steps``
false (Kineto keeps a key's last value); in parts, that step's part is left out of the join, so the
trace ends with the last working step, as a window of N steps does.

Export (``export_chrome_trace`` to plain JSON) runs on a separate thread. Kineto serialises holding
the GIL from the first event to the last, as ``stop()`` does (measured: a second thread of the
process cannot run meanwhile, ``benchmarks/bench_profiler_stop.py``), so the engine's next step waits
for it where it needs the GIL. A forked child writing the file instead was measured and not kept:
on a 2-core host the worker's ``fork()`` (its page tables copied, also under the GIL) cost about as
much as the export (docs/benchmarks.md, issue 15). Compression and merging are left to the sidecar
process; see docs/architecture.md, "The path of a capture, module by module".

The probe's own limits (``ProbeLimits``) hold whatever the sidecar asked: the window closes after
``max_capture_s`` (sidecar/common/step_window.py; the API server's window on its event loop), and an
exported file over ``max_trace_mb`` is deleted and reported failed. The file's folder must still be
the one the probe chose at ``arm`` when the export writes it (sidecar/probe/capture/trace_root.py).

Python stacks (``spec.stacks``): "sampled" gives the capture a ``StackSampler`` (sidecar/stacks/sampler.py),
built at ``arm`` on the link thread; an API server's (``WindowCapture``) samples its event loop at
no more than ``WINDOW_MAX_STACK_HZ``. It starts right after the profiler and stops right before it,
so its samples cover exactly the recorded steps; on the step thread each costs a flag and a clock
read. After the trace, the export thread dumps the raw samples beside it
(``<stem>.stacks.msgpack``, sidecar/stacks/samples_file.py: buffer copies and one msgpack encoding) and
reports that file; the sidecar builds the slices and the summary from it, outside this process.
``spec.with_modules``: torch.profiler's module hierarchy, recorded only where the tracer is allowed
(``module_mode``), which it needs. The
samples file gets the trace's checks (the folder chosen at ``arm``, the byte limit, a full disk): a
failure there loses the stacks, never the trace, and the report's ``stack_summary`` says why.
"traced" is torch.profiler's own ``with_stack``, which the probe passes only in a role that allows
it (``Role.traced_stacks``): the probe decides, per process, which of the two a capture gets
(``stack_mode``), and the report says which it was.

Phase ranges (``phase_scopes``, given by the engine integration): switched on right after the
profiler starts and off right before it stops, on the same thread, so the engine's named ranges of a
step's phases exist only while a capture records (docs/analysis.md, "Step anatomy"). A switch that
fails costs the ranges, never the capture. ``phase_table`` (the profile's range name → phase for
this process) is written into the trace as its top-level ``inference_sidecar`` member
(sidecar/common/phases.py), which is how the analysis knows the ranges without knowing the engine.

Reports go out as ``CaptureReport`` structs (sidecar.common.protocol).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Executor
from time import perf_counter_ns
from typing import Any, Callable

from ...common.phases import PHASE_RANGES_KEY, TRACE_MEMBER, WHOLE_STEPS_KEY
from ...common.protocol import P_CAPTURING, P_DONE, P_EXPORTING, CaptureReport, CaptureSpec
from ...stacks.samples_file import samples_path
from ...common.step_window import FINISHED, RECORDING, StepWindow
from .limits import ProbeLimits
from .profiler_options import WINDOW_MAX_STACK_HZ, make_profiler, make_sampler, records_in_parts
from .trace_parts import join_parts, part_path
from .trace_root import NO_SPACE, discard, export_problem, is_disk_full, release

log = logging.getLogger(__name__)

Report = Callable[[CaptureReport], None]


class StepCapture(StepWindow):
    """One capture in one step-driven process (engine core, worker)."""

    RECORDING_STATE = P_CAPTURING
    OPEN_FAILED = "profiler failed to start"
    # Its ProfilerStep ranges open and close at step boundaries only: the trace says so (WHOLE_STEPS_KEY).
    WHOLE_STEPS = True
    MAX_STACK_HZ: float | None = None  # the step thread is sampled at the rate asked
    CANCELLED = "no step recorded before the capture ended"

    def __init__(
        self,
        spec: CaptureSpec,
        trace_path: str,
        report: Report,
        exporter: Executor,
        cuda_available: bool = False,
        limits: ProbeLimits | None = None,
        stacks: str = "none",
        phase_scopes: Callable[[bool], None] | None = None,
        phase_table: dict[str, str] | None = None,
    ) -> None:
        """``stacks``: what ``stack_mode`` chose for this process. ``phase_scopes``: the engine's
        switch of its phase ranges (True: on), called on the recording thread."""
        super().__init__(spec.steps)
        self._phase_scopes = phase_scopes
        self._phase_table = phase_table
        self.spec = spec
        self.trace_path = trace_path
        # Resolved now, checked again before the export writes: the folder cannot be swapped for a
        # link to elsewhere in between.
        self._trace_dir = os.path.realpath(os.path.dirname(trace_path))
        self._report = report
        self._exporter = exporter
        self._cuda = cuda_available
        self._limits = limits
        if limits is not None:
            self.limit_time(limits.max_capture_s, limits.duration_reason)
        self._prof = None
        self._recording_thread: int | None = None  # the thread that started the profiler: only it may stop it
        # Time the profiler's own calls took on the thread that runs the engine (start, each step,
        # stop): what the capture cost the step loop directly, reported with every state.
        self._on_step_thread_ns = 0
        self.stacks = stacks
        # Built here (the link thread): its thread starts now, not on the step thread.
        self._sampler = make_sampler(spec, limits, self.MAX_STACK_HZ) if stacks == "sampled" else None
        # One profiler session per step (records_in_parts): the parts exported so far, in step order,
        # and the first problem one of them met (the capture fails with it once the last is in).
        self._in_parts = records_in_parts(spec, stacks)
        self._parts: list[str] = []
        self._part_problem: str | None = None
        self._parts_export_ns = 0

    def abandon(self, error: str) -> None:
        """Give up after an unexpected error on the step path; report it, leave the engine alone."""
        with self._lock:
            self.state = FINISHED
        self._drop_sampler()
        prof, self._prof = self._prof, None
        self._switch_scopes(False)
        if prof is not None:
            try:
                prof.stop()
            except Exception:
                pass
        self._fail(error)

    def _fail(self, error: str) -> None:
        self._drop_sampler()
        if self._parts:
            try:
                self._exporter.submit(self._discard_parts)  # after any part still being exported
            except RuntimeError:  # the probe is closing: its export thread is gone
                self._discard_parts()
        super()._fail(error)

    def _discard_parts(self) -> None:
        for path in self._parts:
            if os.path.realpath(os.path.dirname(path)) == self._trace_dir:  # never through a swapped link
                discard(path)
        self._parts = []

    def _drop_sampler(self) -> None:
        sampler, self._sampler = self._sampler, None
        if sampler is not None:
            sampler.close()

    # -- the window's hooks (step thread) ----------------------------------------------------------
    def end_now(self, reason: str) -> None:
        """End the window on the calling thread, between steps: an armed window is cancelled; a
        recording one stops now when this is the thread that started it (the engine's step thread),
        else at its next step boundary, as a stop request does."""
        if self.request_stop(reason):
            return
        if threading.get_ident() == self._recording_thread:
            self._close()

    def _start_recording(self) -> None:
        began = perf_counter_ns()
        self._recording_thread = threading.get_ident()
        self._prof = self._new_profiler()
        self._prof.start()  # opens ProfilerStep#0
        sampler = self._sampler
        if sampler is not None:  # after the profiler: its samples fall inside the recorded steps
            sampler.start(threading.get_ident())
        self._note_trace(self._prof, whole=True)
        self._switch_scopes(True)  # last: nothing after it can fail the start and leave them on
        self._on_step_thread_ns += perf_counter_ns() - began

    def _new_profiler(self):
        # Module ranges come from the tracer: asked for (spec) and affordable here (stacks "traced").
        traced = self.stacks == "traced"
        return make_profiler(self.spec, self._cuda, with_stack=traced, with_modules=traced and self.spec.with_modules)

    def _step_began(self, n: int, new: bool) -> None:
        if new and n:  # each later working step opens the next ProfilerStep#<n>
            began = perf_counter_ns()
            if self._in_parts:
                self._next_part(n)
            else:
                self._prof.step()
            self._on_step_thread_ns += perf_counter_ns() - began

    def _next_part(self, n: int) -> None:
        """Stop the session of the step before (its export goes to the export thread) and start
        step ``n``'s, its annotation numbered on: ``ProfilerStep#<n>``. A failure here raises, and
        the probe abandons the capture (the engine goes on)."""
        prof, self._prof = self._prof, None
        prof.stop()
        path = part_path(self.trace_path, len(self._parts))
        self._parts.append(path)
        self._exporter.submit(self._export_part, prof, path)
        nxt = self._new_profiler()
        nxt.step_num = n  # torch's own counter: start() opens ProfilerStep#<step_num>
        nxt.start()
        self._prof = nxt

    def _last_range_did_work(self) -> bool:
        """Whether the last ProfilerStep range holds a step that did work. Ranges open at steps
        announced with work (``_marked``: the last), working steps are counted (``_recorded``), and a
        step begins with a new number only after one did work: the last range holds none exactly when
        the step that opened it did none and the window closed before the next began."""
        return self._recorded >= self._marked - self.first_step + 1

    def _stop_recording(self) -> None:
        began = perf_counter_ns()
        if self._sampler is not None:
            self._sampler.stop()  # a flag and a clock read; the sampler parks by itself
        self._switch_scopes(False)
        prof, self._prof = self._prof, None
        drop_last = False
        if self.WHOLE_STEPS and not self._last_range_did_work():
            if self._parts:  # that range is the last part alone: left out of the join
                drop_last = True
            else:  # one session: the member says no more that the ranges are whole
                self._note_trace(prof, whole=False)
        try:
            prof.stop()
            self._on_step_thread_ns += perf_counter_ns() - began
        except Exception as exc:
            log.warning("inference-sidecar: profiler failed to stop: %s", exc)
            self._fail(f"profiler failed to stop: {exc}")
            return
        self._report_state(P_EXPORTING)
        self._exporter.submit(self._export, prof, drop_last)

    def _note_trace(self, prof, whole: bool) -> None:
        """The trace's ``TRACE_MEMBER`` (sidecar/common/phases.py): the phase table, and for a step-driven
        process whether its step ranges are whole. Written whole each time: a second call for the
        key replaces the first (Kineto keeps a key's last value)."""
        member: dict[str, Any] = {}
        if self._phase_table:
            member[PHASE_RANGES_KEY] = self._phase_table
        if self.WHOLE_STEPS:
            member[WHOLE_STEPS_KEY] = whole
        if not member:
            return
        try:  # a top-level member of the exported trace (only while the profiler runs)
            prof.add_metadata_json(TRACE_MEMBER, json.dumps(member))
        except Exception as exc:  # the capture goes on: no step anatomy, the last step judged by its length
            log.warning("inference-sidecar: capture %s: %s not noted in the trace: %s", self.spec.id,
                        " and ".join(member), exc)

    def _switch_scopes(self, on: bool) -> None:
        scopes = self._phase_scopes
        if scopes is None:
            return
        if not on:
            self._phase_scopes = None  # switched off once, whichever way the recording ends
        try:
            scopes(on)
        except Exception as exc:  # the ranges are a bonus: the capture goes on without them
            log.warning("inference-sidecar: capture %s: phase ranges not switched %s: %s",
                        self.spec.id, "on" if on else "off", exc)

    # -- the export thread -------------------------------------------------------------------------
    def _write(self, prof, path: str) -> tuple[int, str | None]:
        """Export ``prof``'s trace to ``path``: (its size, None) or (0, why it failed)."""
        try:
            folder = os.path.dirname(path)
            os.makedirs(folder, exist_ok=True)
            if os.path.realpath(folder) != self._trace_dir:
                raise OSError(f"{folder} no longer resolves to {self._trace_dir}")
            prof.export_chrome_trace(path)
            # Kineto's writer does not raise on a full disk: an empty or cut-short file is checked here.
            problem = export_problem(None, path)
            size = os.path.getsize(path) if problem is None else 0
        except Exception as exc:
            problem, size = export_problem(exc, path), 0
        # Now, not when the garbage collector gets to it: a failed export's temporary file stays
        # open (and its space taken) while the profiler's results live (trace_root.release).
        release(prof)
        return size, problem

    def _export_part(self, prof, path: str) -> None:
        began = perf_counter_ns()
        _, problem = self._write(prof, path)
        if problem is not None and self._part_problem is None:
            self._part_problem = problem
        self._parts_export_ns += perf_counter_ns() - began

    def _export(self, prof, drop_last: bool = False) -> None:
        began = perf_counter_ns() - self._parts_export_ns  # the parts' exports count in export_ms
        if not self._parts:
            size, problem = self._write(prof, self.trace_path)
        else:
            size, problem = self._join(prof, drop_last)
        if problem is None and self._limits is not None:
            problem = self._limits.trace_problem(size)
        if problem is not None:
            if os.path.realpath(os.path.dirname(self.trace_path)) == self._trace_dir:  # never through a swapped link
                discard(self.trace_path)
            log.warning("inference-sidecar: capture %s: %s", self.spec.id, problem)
            self._fail(problem)
            return
        stacks_file, stack_summary = self._dump_samples(size)
        self._report_state(P_DONE, file=self.trace_path, bytes=size, stacks_file=stacks_file,
                           stack_summary=stack_summary, export_ms=round((perf_counter_ns() - began) / 1e6, 3))

    def _join(self, prof, drop_last: bool = False) -> tuple[int, str | None]:
        """The last part exported, then every part joined into the trace file (trace_parts.py); the
        parts deleted whatever happens. ``drop_last``: the last session recorded no working step
        (``_stop_recording``): not exported, the trace ends with the part before."""
        if drop_last:
            release(prof)
        else:
            self._export_part(prof, part_path(self.trace_path, len(self._parts)))
            self._parts.append(part_path(self.trace_path, len(self._parts)))
        problem, size = self._part_problem, 0
        if problem is None and self._limits is not None:  # over the limit already: not worth joining
            problem = self._limits.trace_problem(sum(os.path.getsize(p) for p in self._parts))
        if problem is None:
            try:
                if os.path.realpath(os.path.dirname(self.trace_path)) != self._trace_dir:
                    raise OSError(f"{os.path.dirname(self.trace_path)} no longer resolves to {self._trace_dir}")
                size = join_parts(self._parts, self.trace_path)
            except OSError as exc:
                problem = export_problem(exc, self.trace_path)
            except ValueError as exc:  # a part not shaped as Kineto writes
                problem = f"trace export failed: the parts could not be joined: {exc}"
        self._discard_parts()
        return size, problem

    def _dump_samples(self, trace_size: int) -> tuple[str | None, dict[str, Any] | None]:
        """The sampled stacks' raw samples beside the trace (export thread): (their file, None), or
        (None, a summary saying why they are lost). The trace is never touched here."""
        sampler, self._sampler = self._sampler, None
        if sampler is None:
            return None, None
        path = samples_path(self.trace_path)
        in_place = False
        try:
            in_place = os.path.realpath(os.path.dirname(path)) == self._trace_dir  # never through a swapped link
            if not in_place:
                raise OSError(f"{os.path.dirname(path)} no longer resolves to {self._trace_dir}")
            size = sampler.dump(path)
            problem = self._limits.samples_problem(trace_size, size) if self._limits is not None else None
        except Exception as exc:
            problem = _samples_problem(exc, path)
        finally:
            sampler.close()
        if problem is None:
            return path, None
        if in_place:  # a file cut short keeps its space: deleted
            try:
                os.unlink(path)
            except OSError:
                pass
        log.warning("inference-sidecar: capture %s: python stacks lost: %s", self.spec.id, problem)
        return None, {"samples": sampler.samples, "error": f"python stacks not saved: {problem}"[:500]}

    def _report_state(self, state: str, **fields: Any) -> None:
        self._report(CaptureReport(
            job_id=self.spec.id, state=state, steps_recorded=self._recorded, first_step=self.first_step,
            stop_reason=self._stop_reason, stacks=self.stacks,
            step_thread_ms=round(self._on_step_thread_ns / 1e6, 3), **fields))


class WindowCapture(StepCapture):
    """One capture in a process without forward steps (the API server).

    It records from ``arm`` (sent to every process at once) until the sidecar sends ``stop``, when
    the last step-driven process has finished. Start and stop run on the process's asyncio loop
    thread, the thread whose work is worth recording: torch.profiler records the ops of the thread
    that started it (measured on vLLM's API server, 2-core host at load 10-18: construct 0.2-0.3
    ms, ``start()`` 0.9-24 ms, ``stop()`` 0.8-3.3 ms). Sampled stacks of that thread are taken at
    most ``WINDOW_MAX_STACK_HZ`` times a second.
    """

    MAX_STACK_HZ = WINDOW_MAX_STACK_HZ
    WHOLE_STEPS = False  # one ProfilerStep#0 over a window the sidecar ends: no step boundary

    def __init__(self, spec, trace_path, report, exporter, loop, cuda_available=False, limits=None,
                 stacks="none", phase_scopes=None, phase_table=None) -> None:
        super().__init__(spec, trace_path, report, exporter, cuda_available, limits, stacks, phase_scopes,
                         phase_table)
        self._loop = loop

    def start_window(self) -> None:
        self._loop.call_soon_threadsafe(self._open_window)

    def _open_window(self) -> None:
        if self._open(None) and self._time_limit is not None:
            seconds, reason = self._time_limit
            self._loop.call_later(seconds, self._time_up, reason)

    def _time_up(self, reason: str) -> None:
        if self.state == RECORDING:
            self._stop_reason = reason
            self._close()

    def request_stop(self, reason: str) -> bool:
        if self.state != FINISHED:  # a window the time limit closed keeps that reason
            self._stop_reason = reason
        self._loop.call_soon_threadsafe(self._close)
        return False


def _samples_problem(error: BaseException, path: str) -> str:
    """Why writing the samples file failed, naming a full disk."""
    if not isinstance(error, OSError):
        return f"{type(error).__name__}: {error}"
    if is_disk_full(error):
        return f"{NO_SPACE} ({os.path.dirname(path)})"
    return str(error)
