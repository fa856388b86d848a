"""A function run in a forked child that answers through a pipe: what ``diff/pair.py`` (``sidecar diff``'s
second trace) and ``halves.py`` (a large file's head) both do.

``fork`` gives None where no child can be had (no ``os.fork``, out of descriptors or processes),
and the caller then does the work itself. The child runs ``work(pipe)`` and leaves with
``os._exit``, whatever happens, so it never runs the parent's exit handlers or flushes the parent's
buffers (both were flushed before the fork). ``spare_core`` says whether a child is worth having:
more than one core, and no other thread here (a forked child gets a copy of the locks such a thread
holds, and may wait on one forever).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import BinaryIO, Callable, Optional, TypeVar

T = TypeVar("T")


def spare_core() -> bool:
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > 1


class Child:
    """A forked child and the read end of its pipe. ``receive`` once; ``cancel`` always (idempotent)."""

    def __init__(self, pid: int, fd: int) -> None:
        self._pid: Optional[int] = pid
        self._fd: Optional[int] = fd
        self.status = 0  # its wait status, once reaped

    def receive(self, read: Callable[[BinaryIO], T]) -> T:
        """``read(pipe)``, then the child reaped (also when ``read`` raises)."""
        assert self._fd is not None, "receive() is called once"
        with os.fdopen(self._fd, "rb") as pipe:
            self._fd = None
            try:
                return read(pipe)
            finally:
                self._reap()

    def cancel(self) -> None:
        """Kill the child (its work is of no use) and reap it; nothing left to do after ``receive``."""
        if self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:  # already gone and reaped (SIGCHLD ignored: see _reap)
                pass
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._reap()

    def _reap(self) -> None:
        if self._pid is not None:
            try:
                _pid, self.status = os.waitpid(self._pid, 0)
            except ChildProcessError:  # a process started with SIGCHLD ignored has its children reaped for it
                pass
            self._pid = None


def fork(work: Callable[[BinaryIO], None]) -> Optional[Child]:
    """Run ``work(pipe)`` in a forked child; None where no child can be had."""
    if not hasattr(os, "fork"):
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        read_fd, write_fd = os.pipe()
    except OSError:  # out of descriptors
        return None
    try:
        pid = os.fork()
    except OSError:  # out of processes or memory
        os.close(read_fd)
        os.close(write_fd)
        return None
    if pid == 0:
        try:
            os.close(read_fd)
            with os.fdopen(write_fd, "wb") as pipe:
                work(pipe)
        finally:
            os._exit(0)
    os.close(write_fd)
    return Child(pid, read_fd)
