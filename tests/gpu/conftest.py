"""Checks only a CUDA host can make: the real sidecar process, stand-in engines doing their step's work on
the GPU (tests/fake_engine.py --device cuda), and what the project reads from it: CUDA kernels in a
capture and its analysis, real GPU->CPU syncs in a scan and in the always-on watch, NVML readings; every
job under the stand-in's CUDA-graph mode (test_cuda_graphs.py) and an nsys capture under a real Nsight
Systems (test_nsys.py, which needs ``nsys`` on PATH).

`make test-gpu` runs them (and fails where there is no CUDA device); `make test` collects them only on
a CUDA host. docs/gpu.md records the last run.
"""

from __future__ import annotations

import os

import pytest
import torch

from host import GpuHost

if not torch.cuda.is_available():
    raise pytest.UsageError("tests/gpu needs a CUDA device (torch.cuda.is_available() is False)")


@pytest.fixture
def gpu_host(tmp_path):
    def make(**env: str) -> GpuHost:
        return GpuHost(tmp_path / f"host-{len(os.listdir(tmp_path))}", **env)

    return make
