"""``analyse_pair``: the summaries of two traces, read at once where the host has a core to spare.

``sidecar diff`` reads two traces; one after the other they take twice the time of one, and a diff
should cost about what ``sidecar analyze`` does. So a forked child reads B while this process reads A,
each streaming its own file, and the child hands its summary back pickled through a pipe. Memory at
the peak is then that of two analyses, as two ``sidecar analyze`` run side by side would take.

They are read one after the other with a single core, without ``os.fork`` (Windows), or when another
thread runs here (a forked child gets a copy of the locks such a thread holds, and may wait on one
forever).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import traceback
from typing import Callable, Optional

from .errors import TraceFormatError

# (the summary, or None and the TraceFormatError's message)
Outcome = tuple[Optional[dict], Optional[str]]


def analyse_pair(a: str, b: str, analyse: Callable[[str], dict]) -> tuple[Outcome, Outcome]:
    """``analyse(a)`` and ``analyse(b)``; a TraceFormatError of either becomes its outcome's message."""
    if not spare_core():
        return _outcome(analyse, a), _outcome(analyse, b)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        read_fd, write_fd = os.pipe()
    except OSError:  # out of descriptors: one after the other
        return _outcome(analyse, a), _outcome(analyse, b)
    try:
        pid = os.fork()
    except OSError:  # out of processes or memory: one after the other
        os.close(read_fd)
        os.close(write_fd)
        return _outcome(analyse, a), _outcome(analyse, b)
    if pid == 0:
        _child(read_fd, write_fd, analyse, b)  # never returns
    os.close(write_fd)
    reader = os.fdopen(read_fd, "rb")
    try:
        first = _outcome(analyse, a)
        data = reader.read()
    except BaseException:  # Ctrl-C, or a fault here: the child's work is of no use
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # already reaped (SIGCHLD ignored, below)
            pass
        raise
    finally:
        reader.close()
        try:
            _pid, status = os.waitpid(pid, 0)
        except ChildProcessError:  # started with SIGCHLD ignored: the system reaped it; its answer is read
            status = 0
    if not data:  # killed (out of memory, say) before it could answer
        raise RuntimeError(f"the analysis of {b} ended without a result (wait status {status})")
    kind, value = pickle.loads(data)
    if kind == "fault":  # a bug, not bad input: shown as the sequential path would show it
        raise RuntimeError(f"the analysis of {b} failed:\n{value}")
    return first, value


def spare_core() -> bool:
    if not hasattr(os, "fork") or threading.active_count() > 1:
        return False
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > 1


def _outcome(analyse: Callable[[str], dict], path: str) -> Outcome:
    try:
        return analyse(path), None
    except TraceFormatError as exc:
        return None, str(exc)


def _child(read_fd: int, write_fd: int, analyse: Callable[[str], dict], path: str) -> None:
    """Analyse ``path``, write the outcome to the pipe, and leave without running the parent's exit
    handlers or flushing its buffers (``os._exit``), whatever happens."""
    try:
        os.close(read_fd)
        try:
            answer = ("outcome", _outcome(analyse, path))
        except BaseException:
            answer = ("fault", traceback.format_exc())
        with os.fdopen(write_fd, "wb") as pipe:
            pickle.dump(answer, pipe, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        os._exit(0)
