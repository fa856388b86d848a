"""``sidecar serve`` as its own process, for the tests that need the real command: its flags, its
process-wide settings (umask), its sockets. Not a test module: the helpers the tests share."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ANNOUNCE = re.compile(r"listening on (.*?)  traces in ")


def serve_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The user's environment without a token, and a token file of the test's own."""
    env = {k: v for k, v in os.environ.items() if k != "SIDECAR_TOKEN"}
    return {**env, "SIDECAR_TOKEN_FILE": str(tmp_path / "token"), **extra}


class Served:
    """``sidecar serve ARGS``, started; ``wait()`` reads its stderr up to the announce line or its exit."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "serve", *args],
                                     stderr=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []

    def wait(self) -> list[str] | None:
        """The URLs of the announce line, or None when the sidecar exited before it (its code in
        ``self.proc.returncode``, its stderr in ``self.lines``). Bounded by pytest's timeout."""
        for line in self.proc.stderr:
            self.lines.append(line)
            found = ANNOUNCE.search(line)
            if found:
                return re.findall(r"http://\S+?(?=,|\s|$)", found.group(1))
        self.proc.wait(timeout=60)
        return None

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()
