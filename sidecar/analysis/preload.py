"""``early_read``: ``sidecar analyze`` reads its trace in a forked child while it imports the analyser.

A run spends about a third of its time importing numpy and the analyses before it reads a byte, then
reads (gunzip, decode, the per-event collection), which needs neither. With a core to spare, a child
forked before those imports reads the file into the collector's ``array.array`` columns
(``collect.read_columns``, no numpy) and hands them back pickled through a pipe (a few MB: the
compact columns, not the JSON); the parent imports meanwhile, then takes the columns
(``collect.as_numpy``) and analyses as ever. The output is the same either way.

Only the command line does this, and only while no other thread runs (pair.py's rule: a forked child
gets a copy of the locks such a thread holds). This module imports nothing heavy: numpy must not be
loaded before the fork, or the child would have nothing left to overlap.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import traceback
from pathlib import Path
from typing import Optional

from . import pair
from .collect import TraceData, as_numpy, read_columns
from .errors import TraceFormatError


class EarlyRead:
    """A child reading ``path``; ``load`` gives its columns for that file and reads any other here.
    A context manager: leaving it kills a child whose answer was never taken."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path  # the file the child reads; None: no child
        self._pid: Optional[int] = None
        self._fd: Optional[int] = None
        if path is not None:
            self._fork()

    def _fork(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            _child(read_fd, write_fd, str(self.path))  # never returns
        os.close(write_fd)
        self._pid, self._fd = pid, read_fd

    def load(self, file: Path) -> TraceData:
        """The trace data of ``file``: the child's when it read this file, else read here."""
        if self._fd is None or Path(file) != self.path:
            return read_here(file)
        fd, self._fd = self._fd, None
        try:
            with os.fdopen(fd, "rb") as reader:
                data = reader.read()
        except BaseException:  # Ctrl-C, or a fault here: the child's work is of no use
            self._kill()
            raise
        finally:
            self._reap()
        answer = pickle.loads(data) if data else ("lost", None)
        if answer[0] == "columns":
            return as_numpy(answer[1])
        if answer[0] == "unreadable":
            raise TraceFormatError(*answer[1])
        # The child died or failed: read here, where a fault shows as it would without the child.
        return read_here(file)

    def _kill(self) -> None:
        if self._pid is not None:
            os.kill(self._pid, signal.SIGKILL)

    def _reap(self) -> None:
        if self._pid is not None:
            os.waitpid(self._pid, 0)
            self._pid = None

    def __enter__(self) -> "EarlyRead":
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:  # the answer was never taken (an error before): the child's work is of no use
            os.close(self._fd)
            self._fd = None
            self._kill()
        self._reap()


def early_read(path: str) -> EarlyRead:
    """Start reading ``path`` in a child when it is a file and a core is spare (any other file is
    read where ``load`` is called: a folder's files, or all of them without a child)."""
    forked = os.path.isfile(path) and pair._spare_core()
    return EarlyRead(Path(path) if forked else None)


def read_here(file: Path) -> TraceData:
    """``summary.load`` without importing summary (and so every analysis) first."""
    return as_numpy(read_columns(str(file)))


def _child(read_fd: int, write_fd: int, path: str) -> None:
    """Read ``path``, write the columns (or why they cannot be read) to the pipe, and leave without
    running the parent's exit handlers or flushing its buffers (``os._exit``), whatever happens."""
    try:
        os.close(read_fd)
        try:
            answer: tuple = ("columns", read_columns(path))
        except TraceFormatError as exc:
            answer = ("unreadable", (exc.path, exc.problem))
        except BaseException:
            answer = ("fault", traceback.format_exc())
        with os.fdopen(write_fd, "wb") as pipe:
            pickle.dump(answer, pipe, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        os._exit(0)
