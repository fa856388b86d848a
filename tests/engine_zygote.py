"""Stand-in engines (tests/fake_engine.py) forked from one process that has already imported torch and
the probe, instead of each started as a new interpreter. Not a test module.

Why: a stand-in's start is mostly ``import torch`` and ``sidecar.probe`` (4 s of CPU on the 2-core host,
``/usr/bin/time .venv/bin/python -c "import torch; import sidecar.probe"``), and the suite starts
one in each of dozens of tests (tests/test_service.py ``engines`` and every file that uses it) on a 2-core
host. A fork costs milliseconds.

What a forked engine is: the zygote (``python tests/engine_zygote.py``, one per test session) imports
what tests/fake_engine.py imports and waits on its stdin for ``{"argv": [...], "env": {...}}`` lines;
for each it forks, and the child takes that environment, runs tests/fake_engine.py as ``__main__``
(``runpy``: the module's own code runs again, so what it reads from the environment is the child's),
and exits; the zygote answers the child's pid. The zygote has started no thread and run no torch op,
so the child's fork is as safe as a fresh start (``threading.active_count()`` and the task count are
checked before each fork: a zygote that has grown a thread refuses). Stand-ins that change what the
imported modules bound at import (``FAKE_ENGINE_CLOCK_SKEW_S``: ``from time import time_ns``;
``FAKE_ENGINE_PID``; ``FAKE_ENGINE_HOST``), or that ask for another OpenMP pool, start as a process of
their own, as before (``needs_own_interpreter``).

The zygote ignores SIGCHLD, so the kernel reaps its children: ``ForkedEngine.poll()`` knows that a
child is gone, not its exit status (the tests kill their stand-ins; none reads their status).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
# What makes a stand-in need an interpreter of its own (see the module's docstring).
OWN_INTERPRETER_ENV = ("FAKE_ENGINE_CLOCK_SKEW_S", "FAKE_ENGINE_PID", "FAKE_ENGINE_HOST")
ZYGOTE_OMP_THREADS = "1"  # tests/fake_engine.py's own default, fixed in the zygote when torch loads


def needs_own_interpreter(env: dict[str, str]) -> bool:
    return any(env.get(name) for name in OWN_INTERPRETER_ENV) or env.get("OMP_NUM_THREADS", ZYGOTE_OMP_THREADS) != ZYGOTE_OMP_THREADS


class ForkedEngine:
    """A child of the zygote, driven as much like ``subprocess.Popen`` as the tests drive their stand-ins."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                self.returncode = -1  # gone; its status went to the kernel's reaping
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(FAKE_ENGINE), timeout)
            time.sleep(0.01)
        return self.returncode


class Zygote:
    """The session's zygote process; ``spawn`` forks a stand-in from it."""

    def __init__(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS=ZYGOTE_OMP_THREADS)
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__))], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)

    def spawn(self, args: list[str], env: dict[str, str]) -> ForkedEngine:
        self._proc.stdin.write(json.dumps({"argv": args, "env": env}) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the stand-in engines' zygote exited (code {self._proc.poll()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the stand-in engines' zygote refused to fork: {answer['error']}")
        return ForkedEngine(answer["pid"])

    def close(self) -> None:
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _fork_one(request: dict) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the engine's own children are its to wait for
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [str(FAKE_ENGINE), *request["argv"]]
        import runpy

        runpy.run_path(str(FAKE_ENGINE), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 (the child's end; nothing to hand it to)
        code = 1
    finally:
        os._exit(code)


def _serve() -> None:
    import threading

    import torch  # noqa: F401  (imported once, here: the point of the zygote)

    import sidecar.probe  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    out = sys.stdout
    for line in sys.stdin:
        tasks = len(os.listdir("/proc/self/task"))
        if threading.active_count() != 1 or tasks != 1:
            out.write(json.dumps({"error": f"{threading.active_count()} Python threads, {tasks} tasks"}) + "\n")
        else:
            out.write(json.dumps({"pid": _fork_one(json.loads(line))}) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
