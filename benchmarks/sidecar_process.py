"""``sidecar serve`` in a process of its own, so that its memory is its own, read from /proc.

A benchmark that measures the sidecar's peak memory (bench_many_ranks.py) starts it here on a free
port with a token file, limits high enough never to bite, and its log drained; ``RssSampler``
follows its resident memory while a capture runs, ``status_kib`` and ``cpu_s`` read its peak and
CPU time at the end. Linux only (/proc).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path


class Sidecar:
    """``sidecar serve`` on a free port, its memory read from /proc/<pid>/status."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.token_file = work / "token"
        env = {**os.environ, "SIDECAR_TOKEN_FILE": str(self.token_file)}
        env.pop("SIDECAR_TOKEN", None)
        exe = Path(sys.executable).with_name("sidecar")
        cmd = [str(exe)] if exe.exists() else [
            sys.executable, "-c", "import sys; from sidecar.cli import main; sys.exit(main())"]
        self.proc = subprocess.Popen(
            [*cmd, "serve", "--port", "0", "--trace-dir", str(work / "sidecar-traces"), "--log-level", "WARNING",
             "--max-capture-mb", str(1 << 20), "--keep-mb", str(1 << 20), "--min-free-mb", "0"],
            stderr=subprocess.PIPE, text=True, env=env, cwd=work)
        self.url = self._wait_listening()
        self.token = self.token_file.read_text().strip()
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_listening(self, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                return m.group(1)
        self.close()
        raise RuntimeError("the sidecar did not start:\n" + "".join(lines))

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def status_kib(self, field_name: str) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return int(re.search(rf"{field_name}:\s+(\d+)", fh.read()).group(1))

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RssSampler:
    """The highest resident memory of a process seen while it runs, and when (every ``every_s``)."""

    def __init__(self, sidecar: Sidecar, every_s: float = 0.05) -> None:
        self.sidecar, self.every_s = sidecar, every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "RssSampler":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((round(time.monotonic() - self.t0, 3), self.sidecar.status_kib("VmRSS")))
            except (OSError, AttributeError):
                return
            self._stop.wait(self.every_s)
