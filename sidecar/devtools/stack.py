"""Start an engine's OpenAI-compatible server with its plugin, and the sidecar beside it, as
subprocesses.

Used by ``make demo``, the end-to-end tests and the benchmarks, so all three run the same thing a user
runs. ``Stack`` is engine-agnostic: an engine integration subclasses it with its server's command line
(``server_command``), its environment (``server_env``) and how many of its processes connect to the
sidecar (``processes``); the vLLM one is ``sidecar_vllm.devtools.VllmStack``.
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
from typing import ClassVar, Mapping

from ..common import config


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
    server_port: int = field(default_factory=free_port)
    sidecar_port: int = field(default_factory=free_port)
    dtype: str = "float32"
    plugin_enabled: bool = True
    server_args: tuple[str, ...] = ()  # appended to the server's command line
    env: dict[str, str] = field(default_factory=dict)
    sidecar_args: tuple[str, ...] = ()
    # Put before the sidecar's and the server's command lines: e.g. ``nsenter ...`` to run both in a
    # mount namespace where the trace dir is a small tmpfs (the full-disk test).
    launcher: tuple[str, ...] = ()
    # The environment the processes start from (``env`` and the stack's own variables go on top); None:
    # this process's at the moment of each start. A test suite starting a server on a thread while
    # other tests change their environment gives the one of its own start.
    base_env: Mapping[str, str] | None = None
    _server: subprocess.Popen | None = None
    _sidecar: subprocess.Popen | None = None

    # What an engine's subclass says about its server.
    engine_label: ClassVar[str] = "the engine server"  # in messages: "starting the sidecar and ..."
    log_name: ClassVar[str] = "server.log"  # the server's output, in work_dir
    health_path: ClassVar[str] = "/health"  # answers 200 once the server serves
    processes: ClassVar[int] = 1  # engine processes that connect to the sidecar once it serves

    def server_command(self) -> list[str]:
        """The server's command line, serving ``model_dir`` as ``served_name`` on 127.0.0.1:``server_port``
        with ``dtype``, then ``server_args``."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to start its engine's server")

    def server_env(self, env: dict[str, str]) -> dict[str, str]:
        """Variables the engine needs on top of ``env`` (the environment so far)."""
        return {}

    @property
    def server_url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"

    @property
    def sidecar_url(self) -> str:
        return f"http://127.0.0.1:{self.sidecar_port}"

    @property
    def trace_dir(self) -> Path:
        """The sidecar's --trace-dir and the engine's SIDECAR_TRACE_DIR: one root for both."""
        given = self.env.get(config.ENV_TRACE_DIR)
        return Path(given) if given else self.work_dir / "traces"

    def _env(self) -> dict[str, str]:
        env = dict(os.environ if self.base_env is None else self.base_env)
        env.update(self.server_env(env))
        env.update({
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "DO_NOT_TRACK": "1",
            "PYTHONUNBUFFERED": "1",
            config.ENV_ENDPOINT: self.sidecar_url,
            # Own token file: tests and demos never touch the user's real one.
            config.ENV_TOKEN_FILE: str(self.work_dir / "token"),
            # The probes write their raw traces under the trace dir the sidecar is given.
            config.ENV_TRACE_DIR: str(self.trace_dir),
        })
        if not self.plugin_enabled:
            env[config.ENV_DISABLE] = "1"
        env.update(self.env)
        return env

    def start_sidecar(self) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.work_dir / "sidecar.log", "ab")
        self._sidecar = subprocess.Popen(
            [*self.launcher, sys.executable, "-m", "sidecar.cli", "serve", "--port", str(self.sidecar_port),
             "--trace-dir", str(self.trace_dir), *self.sidecar_args],
            env=self._env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self._wait(f"{self.sidecar_url}/healthz", 60, self._sidecar, "sidecar")

    def stop_sidecar(self, kill: bool = False) -> None:
        self._stop(self._sidecar, kill)
        self._sidecar = None

    def start_server(self, timeout: float = 240, port_tries: int = 3) -> None:
        """Start the engine's server and wait for its health check. Its port was free when chosen
        (``free_port``) but another process can take it before the server binds it (two test
        processes side by side): a server that exits saying so is started again on a new port."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        path = self.work_dir / self.log_name
        for attempt in range(port_tries):
            offset = path.stat().st_size if path.exists() else 0
            log = open(path, "ab")
            self._server = subprocess.Popen([*self.launcher, *self.server_command()], env=self._env(), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
            try:
                self._wait(f"{self.server_url}{self.health_path}", timeout, self._server, self.engine_label, raw=True)
                return
            except RuntimeError:
                with open(path, "rb") as f:
                    f.seek(offset)
                    taken = b"Address already in use" in f.read()
                if not taken or attempt == port_tries - 1:
                    raise
                self.server_port = free_port()

    def stop_server(self) -> None:
        self._stop(self._server, kill=False)
        self._server = None

    def wait_for_processes(self, count: int | None = None, timeout: float = 30) -> list[dict]:
        """Wait until ``count`` engine processes (default: ``processes``) are connected to the sidecar."""
        count = self.processes if count is None else count
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

    def start(self, processes: int | None = None, server_timeout: float = 240) -> "Stack":
        """The sidecar, then the server, then wait for its processes (default: ``processes``) to connect."""
        self.start_sidecar()
        self.start_server(timeout=server_timeout)
        self.wait_for_processes(processes, timeout=60)
        return self

    def close(self) -> None:
        self.stop_server()
        self.stop_sidecar()

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
