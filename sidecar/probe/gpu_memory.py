"""The CUDA caching allocator's bytes at each step's end, for the flight recorder (flight_ring.py): "did
memory climb before the slow step" answered after the fact.

The allocator keeps its counters itself (allocated: held by tensors; reserved: taken from the device
by the allocator, free or not). torch (2.13) reads them only through ``memory_stats``, which builds a
dict of every statistic (``torch.cuda.memory_allocated`` flattens that whole dict too): far more than
the step path may pay. So a ``GpuMemory`` measures its read once, off the step path, and chooses:

* ``step_end``: the read costs at most ``max_step_ns`` (1 µs; the median of ``trials`` reads): the
  probe reads at each step's end, on the step thread, the exact value then;
* ``sampled``: dearer (torch's dict of every statistic: expected, not yet timed on a GPU): a thread of the probe's own reads every
  ``interval_s`` (50 ms) and the step's end copies the latest values, two attribute reads. A row then
  holds the allocator's bytes as of at most ``interval_s`` before the step ended.

Which one a process uses is in its recorder dump (``gpu_memory_source``; "pending" until CUDA is
initialised, whose rows hold -1: not known). The default read sums the allocator's counters over the
devices the process sees (a worker uses one; the others read 0), and reads nothing before torch has
initialised CUDA, so it never creates a context (an engine core on a GPU host has none).
"""

from __future__ import annotations

import logging
import threading
from statistics import median
from time import perf_counter_ns
from typing import Callable, Optional

log = logging.getLogger(__name__)

UNKNOWN = -1
MAX_STEP_NS = 1000  # what a read at each step's end may cost (the median of TRIALS)
TRIALS = 200
INTERVAL_S = 0.05
PENDING, STEP_END, SAMPLED = "pending", "step_end", "sampled"

Read = Callable[[], Optional[tuple[int, int]]]  # (allocated, reserved) bytes; None: not readable yet


def torch_allocator_read() -> Read:
    """The allocator's (allocated, reserved) bytes, summed over this process's devices; None while
    torch has not initialised CUDA (reading then would not create a context, but there is nothing)."""
    import torch

    # The nested dict, not memory_stats' flattened copy of it; a build without CUDA has neither.
    stats = getattr(torch._C, "_cuda_memoryStats", None)
    devices: list[int] = []

    def read() -> Optional[tuple[int, int]]:
        if stats is None or not torch.cuda.is_initialized():
            return None
        if not devices:
            devices.extend(range(torch.cuda.device_count()))
        allocated = reserved = 0
        for device in devices:
            s = stats(device)
            allocated += s["allocated_bytes"]["all"]["current"]
            reserved += s["reserved_bytes"]["all"]["current"]
        return allocated, reserved

    return read


class GpuMemory:
    """The latest allocator bytes for the step ring (module docstring). ``read``: the allocator's
    read (default: torch's); the rest are the rule's numbers, for tests."""

    def __init__(self, read: Read | None = None, *, max_step_ns: int = MAX_STEP_NS, trials: int = TRIALS,
                 interval_s: float = INTERVAL_S) -> None:
        self._read = read if read is not None else torch_allocator_read()
        self._max_step_ns = max_step_ns
        self._trials = trials
        self._interval_s = interval_s
        self.allocated = UNKNOWN
        self.reserved = UNKNOWN
        self.source = PENDING
        self.at_step_end = False  # the step's end reads (cheap enough); else it copies the thread's values
        self.read_ns: int | None = None  # the measured median cost of one read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "GpuMemory":
        self._thread = threading.Thread(target=self._run, name="inference-sidecar-gpu-memory", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()

    def read_now(self) -> None:
        """At a step's end (``at_step_end`` only): the allocator's bytes now. Never raises."""
        try:
            value = self._read()
        except Exception:
            value = None
        if value is not None:
            self.allocated, self.reserved = value

    def decide(self) -> bool:
        """Measure the read and choose the source; False while the allocator cannot be read yet."""
        if self._read() is None:
            return False
        costs = []
        for _ in range(self._trials):
            began = perf_counter_ns()
            self._read()
            costs.append(perf_counter_ns() - began)
        self.read_ns = int(median(costs))
        cheap = self.read_ns <= self._max_step_ns
        self.read_now()
        self.source = STEP_END if cheap else SAMPLED
        self.at_step_end = cheap
        log.debug("inference-sidecar: allocator read %d ns: %s", self.read_ns, self.source)
        return True

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self.source == PENDING:
                    if self.decide() and self.at_step_end:
                        return  # the step's end reads from now on: this thread has nothing to do
                else:
                    self.read_now()
                self._stop.wait(self._interval_s)
        except Exception as exc:  # the recorder goes on without memory, the engine never notices
            log.warning("inference-sidecar: allocator bytes not recorded: %s", exc)
