"""Stands in for CUDA's caching allocator on machines without a GPU (torch's own
``torch.cuda.memory._record_memory_history`` raises there): a small caching allocator whose history
and snapshot have the very format ``torch.cuda.memory._snapshot()`` returns (torch/cuda/memory.py), and
a worker that runs a real ``Probe`` with it, stepping on a thread of the test's process.

``FakeAllocator``: segments of at least ``SEGMENT_BYTES`` taken from "the device" (``segment_alloc``) and
kept (a caching allocator never gives them back unless asked); each allocation, rounded up to 512 bytes,
takes the best-fitting free block of a segment, split if larger; a free makes its block inactive again
(``free_requested`` then ``free_completed``) and merges it with free neighbours. While recording, every
action is a history entry ``{action, addr, size, stream, frames, time_us}``, the last ``max_entries``
kept, frames innermost first, the first of them a torch file as in a real stack.

``StandInWorker``: the step allocates what ``STEP_ALLOCS`` says and frees it again, on top of
``WEIGHT_BYTES`` allocated once before any step, so a test knows every figure the summary must give.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any, Callable

SEGMENT_BYTES = 2 * 2**20
ROUND = 512
TORCH_FRAME = {"filename": "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "line": 125,
               "name": "forward"}
MODEL_FILE = "/srv/model/stand_in_model.py"
# What each step of the stand-in worker allocates (bytes, the line and function that asks), in order;
# all of it is freed again by the step's end.
STEP_ALLOCS = ((1 * 2**20, 10, "attention"), (3 * 2**20, 20, "mlp"), (512 * 2**10, 30, "logits"))
WEIGHT_BYTES = 8 * 2**20  # allocated before any step, never freed


def rounded(size: int) -> int:
    return (size + ROUND - 1) // ROUND * ROUND


def site(line: int, name: str) -> str:
    """The site memory_summary.py names for an allocation made at ``MODEL_FILE:line`` in ``name``."""
    return f"{MODEL_FILE}:{line} ({name})"


class FakeAllocator:
    def __init__(self, clock_us: Callable[[], int] = lambda: time.time_ns() // 1000, device: int = 0) -> None:
        self._clock_us = clock_us
        self._device = device
        self._lock = threading.Lock()
        self._segments: list[dict[str, Any]] = []  # {"address", "total_size", "blocks": [{addr, size, state, frames}]}
        self._next_address = 0x7F0000000000
        self._trace: deque | None = None  # while recording
        self.starts: list[int] = []  # max_entries of each start
        self.stops = 0
        self.snapshots = 0
        self.fail_snapshot: Exception | None = None

    # -- the Allocator interface of sidecar/probe/memory_job.py -------------------------------------
    def device(self) -> int:
        return self._device

    def start(self, max_entries: int) -> None:
        with self._lock:
            self._trace = deque(maxlen=max_entries)
            self.starts.append(max_entries)

    def stop(self) -> None:
        with self._lock:
            self._trace = None
            self.stops += 1

    @property
    def recording(self) -> bool:
        return self._trace is not None

    def snapshot(self) -> dict[str, Any]:
        if self.fail_snapshot is not None:
            raise self.fail_snapshot
        with self._lock:
            self.snapshots += 1
            segments = []
            for seg in self._segments:
                blocks = [{"address": b["addr"], "size": b["size"], "requested_size": b["requested"],
                           "state": b["state"], "frames": list(b["frames"])} for b in seg["blocks"]]
                allocated = sum(b["size"] for b in seg["blocks"] if b["state"] != "inactive")
                segments.append({"device": self._device, "address": seg["address"], "total_size": seg["total_size"],
                                 "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
                                 "allocated_size": allocated, "active_size": allocated, "requested_size": allocated,
                                 "blocks": blocks})
            traces: list[list[dict[str, Any]]] = [[] for _ in range(self._device + 1)]
            traces[self._device] = [dict(e) for e in (self._trace or [])]
            return {"segments": segments, "device_traces": traces, "allocator_settings": {}}

    # -- what the stand-in engine does ---------------------------------------------------------------
    def alloc(self, size: int, line: int = 1, name: str = "step") -> int:
        frames = [dict(TORCH_FRAME), {"filename": MODEL_FILE, "line": line, "name": name}]
        need = rounded(size)
        with self._lock:
            best = None
            for seg in self._segments:
                for i, b in enumerate(seg["blocks"]):
                    if b["state"] == "inactive" and b["size"] >= need and (best is None or b["size"] < best[2]["size"]):
                        best = (seg, i, b)
            if best is None:
                total = max(SEGMENT_BYTES, need)
                seg = {"address": self._next_address, "total_size": total,
                       "blocks": [{"addr": self._next_address, "size": total, "requested": 0, "state": "inactive",
                                   "frames": []}]}
                self._next_address += total
                self._segments.append(seg)
                self._record("segment_alloc", seg["address"], total, frames)
                best = (seg, 0, seg["blocks"][0])
            seg, i, block = best
            if block["size"] > need:  # split: the rest stays free
                seg["blocks"].insert(i + 1, {"addr": block["addr"] + need, "size": block["size"] - need,
                                             "requested": 0, "state": "inactive", "frames": []})
                block["size"] = need
            block.update(state="active_allocated", requested=size, frames=frames if self.recording else [])
            self._record("alloc", block["addr"], need, frames)
            return block["addr"]

    def free(self, addr: int) -> None:
        frames = [dict(TORCH_FRAME), {"filename": MODEL_FILE, "line": 99, "name": "release"}]
        with self._lock:
            for seg in self._segments:
                for i, b in enumerate(seg["blocks"]):
                    if b["addr"] == addr and b["state"] == "active_allocated":
                        self._record("free_requested", addr, b["size"], frames)
                        b.update(state="inactive", requested=0, frames=[])
                        self._record("free_completed", addr, b["size"], frames)
                        self._merge(seg)
                        return
        raise KeyError(f"no live block at {addr:#x}")

    def allocated(self) -> int:
        with self._lock:
            return sum(b["size"] for s in self._segments for b in s["blocks"] if b["state"] != "inactive")

    def reserved(self) -> int:
        with self._lock:
            return sum(s["total_size"] for s in self._segments)

    def _merge(self, seg: dict[str, Any]) -> None:
        blocks = seg["blocks"]
        i = 0
        while i < len(blocks) - 1:
            if blocks[i]["state"] == blocks[i + 1]["state"] == "inactive":
                blocks[i]["size"] += blocks.pop(i + 1)["size"]
            else:
                i += 1

    def _record(self, action: str, addr: int, size: int, frames: list[dict[str, Any]]) -> None:
        if self._trace is not None:
            self._trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames,
                                "time_us": self._clock_us(), "device_free": 0})


def step_work(allocator: FakeAllocator) -> None:
    """One working step of the stand-in model: ``STEP_ALLOCS`` in order, then all freed."""
    for addr in [allocator.alloc(size, line, name) for size, line, name in STEP_ALLOCS]:
        allocator.free(addr)


class StandInWorker:
    """A worker process in the test's own: a real ``Probe`` (CUDA claimed, the fake allocator given)
    stepping on a thread, ``step_ms`` apart, each working step ``step_work``; ``idle()`` makes its steps
    empty (no work: an idle engine)."""

    def __init__(self, endpoint: str, rank: int, trace_root: str, *, step_ms: float = 5.0, cuda: bool = True,
                 allocator: FakeAllocator | None = None, **probe_args: Any) -> None:
        from sidecar.probe import Probe

        self.allocator = allocator or FakeAllocator()
        self.weights = self.allocator.alloc(WEIGHT_BYTES, 5, "load_weights")
        # No flight recorder (recorder_steps=0): its GPU-memory column reads torch's real allocator, which a
        # CPU build of torch lacks.
        probe_args.setdefault("recorder_steps", 0)
        self.probe = Probe("worker", rank, endpoint=endpoint, cuda_available=cuda, trace_root=trace_root,
                           memory_allocator=self.allocator, **probe_args)
        self._step_s = step_ms / 1000
        self._working = threading.Event()
        self._working.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"stand-in-worker-{rank}", daemon=True)

    def start(self) -> "StandInWorker":
        self.probe.start()
        self._thread.start()
        return self

    def idle(self, idle: bool = True) -> None:
        (self._working.clear if idle else self._working.set)()

    def _loop(self) -> None:
        while not self._stop.is_set():
            work = self._working.is_set()
            self.probe.step_begin(work)
            if work:
                step_work(self.allocator)
            self.probe.step_end(work)
            time.sleep(self._step_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.probe.close()
