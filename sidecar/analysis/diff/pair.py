"""``analyse_pair``: the summaries of two traces, read at once where the host has a core to spare.

``sidecar diff`` reads two traces; one after the other they take twice the time of one, and a diff
should cost about what ``sidecar analyze`` does. So a forked child reads B while this process reads A,
each streaming its own file, and the child hands its summary back pickled through a pipe. Memory at
the peak is then that of two analyses, as two ``sidecar analyze`` run side by side would take.

They are read one after the other with a single core, without ``os.fork`` (Windows), or when another
thread runs here (``forked.spare_core``), or when no child can be had.
"""

from __future__ import annotations

import pickle
import traceback
from typing import BinaryIO, Callable, Optional

from ..reader import forked
from ..reader.errors import TraceFormatError
from ..reader.forked import spare_core

# (the summary, or None and the TraceFormatError's message)
Outcome = tuple[Optional[dict], Optional[str]]


def analyse_pair(a: str, b: str, analyse: Callable[[str], dict]) -> tuple[Outcome, Outcome]:
    """``analyse(a)`` and ``analyse(b)``; a TraceFormatError of either becomes its outcome's message."""
    child = forked.fork(lambda pipe: _answer(pipe, analyse, b)) if spare_core() else None
    if child is None:
        return _outcome(analyse, a), _outcome(analyse, b)
    try:
        first = _outcome(analyse, a)
        data = child.receive(lambda pipe: pipe.read())
    except BaseException:  # Ctrl-C, or a fault here: the child's work is of no use
        child.cancel()
        raise
    if not data:  # killed (out of memory, say) before it could answer
        raise RuntimeError(f"the analysis of {b} ended without a result (wait status {child.status})")
    kind, value = pickle.loads(data)
    if kind == "fault":  # a bug, not bad input: shown as the sequential path would show it
        raise RuntimeError(f"the analysis of {b} failed:\n{value}")
    return first, value


def _outcome(analyse: Callable[[str], dict], path: str) -> Outcome:
    try:
        return analyse(path), None
    except TraceFormatError as exc:
        return None, str(exc)


def _answer(pipe: BinaryIO, analyse: Callable[[str], dict], path: str) -> None:
    """In the child: analyse ``path`` and write the outcome, or the fault's traceback, to the pipe."""
    try:
        answer = ("outcome", _outcome(analyse, path))
    except BaseException:
        answer = ("fault", traceback.format_exc())
    pickle.dump(answer, pipe, protocol=pickle.HIGHEST_PROTOCOL)
