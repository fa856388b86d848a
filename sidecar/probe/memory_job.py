"""The memory-snapshot job in one process: the CUDA caching allocator's history over N working steps.

A step window (sidecar/common/step_window.py), as a capture, a scan and a module timing are: armed, it
waits for the sidecar's ``begin(start_step)``; at the beginning of the window's first working step it
turns the allocator's history on (``torch.cuda.memory._record_memory_history``, at most
``spec.max_entries`` entries, cleared first, Python stacks), notes the time each working step ends, and
at the end of the N-th (or at the first step boundary after a stop) takes the snapshot and turns the
history off. That is all that happens on the engine's step thread. On the probe's export thread the
snapshot is pickled under the probe's own trace root (``<root>/captures/<id>/raw/<stem>.memory.pickle``:
PyTorch's viewer opens it; a file over ``spec.max_bytes`` or the probe's own byte limit is not kept)
and summarised (memory_summary.py): the sidecar gets JSON, never a pickle to open.

The allocator is reached through ``Allocator`` (``TorchAllocator`` on a CUDA host), so that a test
stand-in can take its place where there is no GPU.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from concurrent.futures import Executor
from typing import Any, Callable, Protocol

from ..common.cuda_graphs import GraphReplays
from .memory_summary import summarize
from ..common.protocol import P_DONE, P_RECORDING, MemoryReport, MemorySpec
from ..common.step_window import StepWindow

log = logging.getLogger(__name__)

Report = Callable[[MemoryReport], None]
SUFFIX = ".memory.pickle"


class Allocator(Protocol):
    """What the job needs of the CUDA caching allocator."""

    def device(self) -> int: ...

    def start(self, max_entries: int) -> None: ...

    def snapshot(self) -> dict[str, Any]: ...

    def stop(self) -> None: ...


class TorchAllocator:
    """torch.cuda's caching allocator (torch/cuda/memory.py, torch 2.13's signatures)."""

    def device(self) -> int:
        import torch

        return int(torch.cuda.current_device())

    def start(self, max_entries: int) -> None:
        import torch

        # context="all", stacks="python": each alloc and free with its Python stack, no C++ frames
        # (those cost an unwind per event); the history of an earlier recording is cleared.
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                                 max_entries=max_entries, clear_history=True)

    def snapshot(self) -> dict[str, Any]:
        import torch

        return torch.cuda.memory._snapshot()

    def stop(self) -> None:
        import torch

        torch.cuda.memory._record_memory_history(enabled=None)


class _TooLarge(Exception):
    pass


class _Bounded:
    """A file that refuses to grow past ``limit`` bytes: the pickle stops there, not after."""

    def __init__(self, file: Any, limit: int) -> None:
        self._file, self._limit, self.written = file, limit, 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        if self.written > self._limit:
            raise _TooLarge()
        return self._file.write(data)


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


class MemorySnapshot(StepWindow):
    RECORDING_STATE = P_RECORDING
    OPEN_FAILED = "the allocator's history could not be turned on"
    CANCELLED = "no step recorded before the job ended"

    def __init__(self, spec: MemorySpec, report: Report, allocator: Allocator, exporter: Executor, path: str,
                 max_bytes: int, clock_us: Callable[[], int] = lambda: time.time_ns() // 1000,
                 graphs: GraphReplays | None = None) -> None:
        """``path``: where the raw snapshot goes (under the probe's root); ``max_bytes``: the smaller of
        the spec's bound and the probe's own; ``clock_us``: the history's clock (unix µs); ``graphs``:
        counts the engine's CUDA graph replays in the window (default: torch's class). A replay
        allocates nothing through the caching allocator (a graph's memory is its pool's, taken when
        it was captured), so steps that replayed one show few or no allocations: said, not hidden."""
        super().__init__(spec.steps)
        self.spec = spec
        self._report = report
        self._allocator = allocator
        self._exporter = exporter
        self._path = path
        self._max_bytes = max_bytes
        self._clock_us = clock_us
        self._device = 0
        self._start_us = 0
        self._ends: list[int] = []  # when each working step of the window ended (unix µs)
        self._n = -1
        self._graphs = graphs if graphs is not None else GraphReplays()

    # -- the window's hooks (step thread) ----------------------------------------------------------
    def _start_recording(self) -> None:
        self._device = self._allocator.device()
        self._start_us = self._clock_us()
        self._allocator.start(self.spec.max_entries)
        try:
            self._graphs.install()
        except Exception as exc:  # no count of replays: the snapshot goes on
            log.warning("inference-sidecar: CUDA graph replays not counted: %s", exc)

    def _step_began(self, n: int, new: bool) -> None:
        self._n = n
        self._graphs.step_began()

    def _step_ended(self) -> None:
        self._graphs.step_ended()
        # One clock read per step while recording; a step without work ends within the last working one.
        if self._n < 0:
            return
        now = self._clock_us()
        if len(self._ends) <= self._n:
            self._ends.append(now)
        else:
            self._ends[self._n] = now

    def _stop_recording(self) -> None:
        self._graphs.uninstall()
        snapshot, error = None, None
        try:  # nothing of this may reach the engine's step
            snapshot = self._allocator.snapshot()
        except Exception as exc:
            error = f"the snapshot could not be taken: {exc}"
        try:
            self._allocator.stop()
        except Exception as exc:
            error = error or f"the allocator's history could not be turned off: {exc}"
        if error is not None:
            log.warning("inference-sidecar: memory snapshot %s: %s", self.spec.id, error)
            self._fail(error)
            return
        try:
            self._exporter.submit(self._finish, snapshot, list(self._ends[: self._recorded or len(self._ends)]))
        except Exception as exc:  # the executor shut down (the probe closing)
            self._fail(f"the snapshot could not be exported: {exc}")

    # -- the export thread -------------------------------------------------------------------------
    def _finish(self, snapshot: dict[str, Any], ends: list[int]) -> None:
        try:
            summary = summarize(snapshot, device=self._device, step_ends_us=ends, start_us=self._start_us,
                                max_entries=self.spec.max_entries)
        except Exception as exc:
            log.warning("inference-sidecar: memory snapshot %s: %s", self.spec.id, exc)
            self._fail(f"the snapshot could not be summarised: {exc}")
            return
        file, size, note = self._write(snapshot)
        summary["raw_file"] = {"kept": file is not None, "bytes": size, "note": note}
        del snapshot
        self._report_state(P_DONE, summary=summary, file=file, bytes=size, entries=summary["entries"],
                           graph_steps=self._graphs.steps, graph_replays=self._graphs.replays)

    def _write(self, snapshot: dict[str, Any]) -> tuple[str | None, int, str | None]:
        """(the raw snapshot's path, its size, None), or (None, bytes written, why it was not kept)."""
        path = self._path
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(path, "wb") as file:
                bounded = _Bounded(file, self._max_bytes)
                pickle.dump(snapshot, bounded, protocol=pickle.HIGHEST_PROTOCOL)
            return path, bounded.written, None
        except _TooLarge:
            note = (f"raw snapshot over the limit of {_mib(self._max_bytes)}: not kept "
                    f"(ask for fewer steps or a smaller max_entries)")
        except OSError as exc:
            note = f"raw snapshot not written: {exc}"
        _remove(path)
        return None, 0, note

    def _report_state(self, state: str, **fields: Any) -> None:
        self._report(MemoryReport(
            job_id=self.spec.id, state=state, steps_recorded=self._recorded, first_step=self.first_step,
            stop_reason=self._stop_reason, **fields))


def _remove(path: str) -> None:
    """The partial file, and its ``raw/`` and ``<id>/`` folders once empty."""
    for name in (path, os.path.dirname(path), os.path.dirname(os.path.dirname(path))):
        try:
            os.unlink(name) if name == path else os.rmdir(name)
        except OSError:
            return
