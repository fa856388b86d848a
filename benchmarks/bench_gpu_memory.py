"""The flight recorder's allocator columns (sidecar/probe/gpu_memory.py) on the step path.

``python benchmarks/bench_gpu_memory.py [--steps N] [--rounds R]``

What ``Probe.step_begin`` + ``step_end`` cost per step with the recorder's GPU memory columns off (a
process without CUDA), on with the values copied from the probe's sampling thread ("sampled"), and on
with a read at each step's end ("step_end"), side by side in one run. Without CUDA the read is a
stand-in returning two ints: these rows measure the plumbing only (the copy, the longer row), never
torch's allocator read. On a CUDA host ``--allocator`` also measures the real read
(``torch_allocator_read``: the median of 200, the figure the probe's rule compares with 1 µs).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from time import thread_time_ns

from sidecar.probe import Probe
from sidecar.probe.gpu_memory import GpuMemory, torch_allocator_read

ENDPOINT = "ws://127.0.0.1:9/probe/ws"  # never started: no sidecar


def per_step_ns(probe: Probe, steps: int) -> float:
    """Thread CPU time per step over ``steps`` steps: another process's load adds no time to it."""
    began = thread_time_ns()
    for _ in range(steps):
        probe.step_begin(True)
        probe.step_end(True, 1, 1)
    return (thread_time_ns() - began) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2_000, help="steps per batch")
    parser.add_argument("--rounds", type=int, default=301, help="batches per row, interleaved")
    parser.add_argument("--allocator", action="store_true", help="also time torch's allocator read (CUDA host)")
    args = parser.parse_args(argv)
    stand_in = lambda: (123_456_789, 234_567_890)  # noqa: E731
    with tempfile.TemporaryDirectory() as root:
        sampled = GpuMemory(stand_in, max_step_ns=0, trials=3)  # never cheap enough: copied, not read
        at_end = GpuMemory(stand_in, max_step_ns=10**9, trials=3)  # always cheap enough: read at the end
        sampled.decide()
        at_end.decide()
        probes = {"off (no CUDA)": Probe("worker", 0, cuda_available=False, trace_root=root, endpoint=ENDPOINT),
                  "sampled (copy)": Probe("worker", 1, cuda_available=False, trace_root=root, endpoint=ENDPOINT,
                                          gpu_memory=sampled),
                  "step_end (stand-in read)": Probe("worker", 2, cuda_available=False, trace_root=root,
                                                    endpoint=ENDPOINT, gpu_memory=at_end)}
        results = {name: [] for name in probes}
        for _ in range(args.rounds):  # interleaved batches: a host's drift hits every row alike
            for name, probe in probes.items():
                results[name].append(per_step_ns(probe, args.steps))
        for probe in probes.values():
            probe.close()
    # The 10th percentile of each row's batches (thread CPU time), as bench_hooks.py reads its figures.
    low = {name: sorted(values)[len(values) // 10] for name, values in results.items()}
    base = low["off (no CUDA)"]
    print("flight recorder's GPU memory columns (Probe.step_begin + step_end, thread CPU time per step, "
          f"10th percentile of {args.rounds} batches of {args.steps})")
    for name, value in low.items():
        print(f"  {name:<26} {value:7.0f} ns   ({value - base:+5.0f} ns)")
    if args.allocator:
        import torch

        if not torch.cuda.is_available():
            print("  --allocator: no CUDA device here", file=sys.stderr)
            return 1
        torch.zeros(1, device="cuda")  # CUDA initialised, as in a worker
        gpu = GpuMemory(torch_allocator_read())
        gpu.decide()
        print(f"  torch's allocator read: {gpu.read_ns} ns (median of 200) -> {gpu.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
