"""The CUDA allocator's bytes in the flight recorder's step rows (sidecar/probe/gpu_memory.py), with a stand-in
read: a cheap one is read at each step's end (the exact bytes then), a dear one by the probe's own thread
(the step's end copies its latest), one not readable yet leaves the rows unknown; a process without CUDA
has no such columns. Through the probe's step path and the sidecar's view of its dump."""

from __future__ import annotations

import time
from time import perf_counter_ns

from sidecar.probe import Probe
from sidecar.probe.flight_ring import StepRing
from sidecar.probe.gpu_memory import GpuMemory
from sidecar.service.incidents.recorder_view import merge, to_chrome_trace


class Allocator:
    """A stand-in allocator: its bytes, and what one read of them costs (busy, in ns)."""

    def __init__(self, cost_ns: int = 0, ready: bool = True) -> None:
        self.allocated, self.reserved = 1000, 4096
        self.cost_ns, self.ready, self.reads = cost_ns, ready, 0

    def read(self):
        self.reads += 1
        if self.cost_ns:
            until = perf_counter_ns() + self.cost_ns
            while perf_counter_ns() < until:
                pass
        return (self.allocated, self.reserved) if self.ready else None


def wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.01)


def test_a_cheap_read_is_taken_at_each_steps_end():
    allocator = Allocator()
    gpu = GpuMemory(allocator.read, max_step_ns=10**9, trials=5)  # any cost is "cheap" here
    assert gpu.decide() and gpu.source == "step_end" and gpu.at_step_end
    ring = StepRing(8, gpu)
    for step in range(3):
        allocator.allocated += 512 * step
        ring.begin()
        ring.end(step, True)
    dump = ring.dump()
    assert dump["gpu_memory_source"] == "step_end"
    assert dump["steps"]["gpu_allocated"] == [1000, 1512, 2536] and dump["steps"]["gpu_reserved"] == [4096] * 3


def test_a_dear_read_goes_to_the_probes_thread_and_the_step_copies_its_latest():
    allocator = Allocator(cost_ns=5_000)  # 5 µs a read: over the 1 µs the step path may pay
    gpu = GpuMemory(allocator.read, trials=20, interval_s=0.01).start()
    try:
        wait_for(lambda: gpu.source != "pending")
        assert gpu.source == "sampled" and not gpu.at_step_end and gpu.read_ns >= 5_000
        ring = StepRing(8, gpu)
        reads = allocator.reads
        ring.end(0, True)
        assert allocator.reads - reads <= 1  # the step's end did not read (at most the thread's own did)
        allocator.allocated = 9999
        wait_for(lambda: gpu.allocated == 9999)  # the thread's next read
        ring.end(1, True)
        assert ring.dump()["steps"]["gpu_allocated"][-1] == 9999
    finally:
        gpu.close()


def test_before_cuda_is_initialised_the_rows_say_unknown():
    allocator = Allocator(ready=False)
    gpu = GpuMemory(allocator.read, trials=3)
    assert not gpu.decide() and gpu.source == "pending"
    ring = StepRing(4, gpu)
    ring.end(0, True)
    dump = ring.dump()
    assert dump["gpu_memory_source"] == "pending" and dump["steps"]["gpu_allocated"] == [-1]


def test_through_the_probes_step_path_and_the_sidecars_view(tmp_path):
    allocator = Allocator()
    gpu = GpuMemory(allocator.read, max_step_ns=10**9, trials=3)
    probe = Probe("worker", 0, cuda_available=True, trace_root=tmp_path, gpu_memory=gpu,
                  endpoint="ws://127.0.0.1:9/probe/ws")  # never started: no sidecar needed
    plain = Probe("worker", 1, cuda_available=False, trace_root=tmp_path, endpoint="ws://127.0.0.1:9/probe/ws")
    try:
        wait_for(lambda: gpu.source == "step_end")
        for step in range(4):
            allocator.allocated = 1 << (20 + step)  # climbing before the slow step
            for p in (probe, plain):
                p.step_begin(True)
                p.step_end(True, 1, 1)
        dump, plain_dump = probe.recorder_dump(), plain.recorder_dump()
        assert "gpu_allocated" not in plain_dump["steps"]["steps"] and "gpu_memory_source" not in plain_dump["steps"]
        now = time.time_ns()
        view = merge([({"label": "w0"}, dump, None), ({"label": "w1"}, plain_dump, None)], now - 60 * 10**9, now)
        with_gpu, without = view["processes"]
        assert with_gpu["gpu_memory_source"] == "step_end"
        assert [row["gpu_allocated"] for row in with_gpu["steps"]] == [1 << 20, 1 << 21, 1 << 22, 1 << 23]
        assert {row["gpu_reserved"] for row in with_gpu["steps"]} == {4096}
        assert without["gpu_memory_source"] is None and "gpu_allocated" not in without["steps"][0]
        trace = to_chrome_trace(view)["traceEvents"]
        counters = [e for e in trace if e["ph"] == "C"]
        assert [e["args"]["allocated"] for e in counters] == [1 << 20, 1 << 21, 1 << 22, 1 << 23]  # w0's only
        assert len({e["pid"] for e in counters}) == 1  # one process's track: the one with CUDA
    finally:
        probe.close()
        plain.close()
