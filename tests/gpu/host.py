"""The sidecar (its real CLI process) and stand-in engine processes on a CUDA host: tests/gpu and
benchmarks/bench_gpu_capture.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sidecar.cli.client import SidecarClient
from sidecar.devtools.stack import Stack

FAKE_ENGINE = Path(__file__).resolve().parents[1] / "fake_engine.py"
MATRIX = 4096  # a worker step's products take milliseconds on the GPU, so a sync's stall is measurable


class GpuHost:
    """The sidecar (its real CLI process) and stand-in engine processes connected to it."""

    def __init__(self, work_dir: Path, **env: str) -> None:
        self.stack = Stack(model_dir=work_dir, work_dir=work_dir, env=dict(env))
        self._engines: list[subprocess.Popen] = []

    def __enter__(self) -> "GpuHost":
        self.stack.start_sidecar()
        self.client = SidecarClient(self.stack.sidecar_url, token="")  # loopback, no HTTP token
        return self

    def engine(self, role: str, *args: str, prefix: tuple[str, ...] = (), **env: str) -> subprocess.Popen:
        """``prefix``: a command the engine runs under (``nsys profile ...``); each engine is the leader
        of a process group of its own, ended whole at the exit."""
        log = open(self.stack.work_dir / f"{role}-{len(self._engines)}.log", "ab")
        proc = subprocess.Popen([*prefix, sys.executable, str(FAKE_ENGINE), role, *args],
                                env={**self.stack._env(), **env}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        self._engines.append(proc)
        return proc

    def standard_engine(self, *worker_args: str, worker_prefix: tuple[str, ...] = (), **env: str) -> list[dict]:
        """An API server, an engine core and one CUDA worker, as vLLM runs them; waits until all three are connected."""
        self.engine("api_server", **env)
        self.engine("engine_core", "--step-ms", "2", **env)
        self.engine("worker", "--rank", "0", "--device", "cuda", "--size", str(MATRIX), "--step-ms", "2",
                    *worker_args, prefix=worker_prefix, **env)
        return self.stack.wait_for_processes(3, timeout=120)

    def __exit__(self, *exc) -> None:
        for proc in self._engines:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the engine and what it started (nsys's child)
            except ProcessLookupError:
                pass
            proc.wait()
        self.stack.stop_sidecar()
