"""Named ranges around an engine's own methods, entered only while a capture records: a probe's
``phase_scopes`` switch (sidecar/probe/capture/profiler.py) for the phases an engine has no scopes of its own
for. The profile's ``phase_ranges`` name the ranges and their phases (sidecar/common/phases.py).

``MethodRanges(targets)``: ``targets()`` is called when the switch goes on (the engine's objects exist
by then) and gives ``(object, method name, range name)``, or ``(object, method name, range name, True)``
for a method that returns a context manager (the range then spans its ``with`` block). On: each method is shadowed by an instance
attribute that enters ``torch.profiler.record_function(range name)`` around the call. Off: the
instance attributes are deleted and the class's method is found again.

Why instance attributes switched at the recording's edges: while no capture records nothing of this
exists, so the engine's calls cost exactly what they did; only calls through the object
(``self.method(...)``) see the range; the switch runs on the thread that records (between two steps,
or on a window role's event loop), so no call sees half of it. A method already shadowed on the
object (by someone else) is left alone.

A coroutine function gets a coroutine function: its range spans the awaited call, so where the call
suspends, whatever its event loop runs meanwhile is inside the range too (say so where it matters).
"""

from __future__ import annotations

import inspect
import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Union

log = logging.getLogger(__name__)

# (object, method name, range name[, returns a context manager])
Target = Union[tuple[Any, str, str], tuple[Any, str, str, bool]]


def _ranged_context(method: Callable, name: str, record_function) -> Callable:
    @contextmanager
    def ranged(*args: Any, **kwargs: Any):
        with record_function(name), method(*args, **kwargs) as value:
            yield value

    return ranged


def _ranged(method: Callable, name: str, record_function) -> Callable:
    if inspect.iscoroutinefunction(method):
        async def ranged_async(*args: Any, **kwargs: Any):
            with record_function(name):
                return await method(*args, **kwargs)

        return ranged_async

    def ranged(*args: Any, **kwargs: Any):
        with record_function(name):
            return method(*args, **kwargs)

    return ranged


class MethodRanges:
    """One process's switch: ``(True)`` when recording starts, ``(False)`` before it stops."""

    def __init__(self, targets: Callable[[], Iterable[Target]]) -> None:
        self._targets = targets
        self._shadowed: list[tuple[Any, str]] = []

    def __call__(self, on: bool, ranges: Callable[[str], Any] | None = None) -> None:
        """``ranges``: what each range enters, a context manager made from its name (None: torch's
        ``record_function``; an nsys capture's NVTX ranges, sidecar/probe/capture/nsys.py)."""
        if on:
            self._on(ranges)
        else:
            self._off()

    @property
    def on(self) -> bool:
        return bool(self._shadowed)

    def _on(self, ranges: Callable[[str], Any] | None = None) -> None:
        if self._shadowed:
            return
        if ranges is not None:
            record_function = ranges
        else:
            from torch.autograd.profiler import record_function

        for obj, attr, name, *context in self._targets():
            state = getattr(obj, "__dict__", None)
            method = getattr(obj, attr, None) if state is not None else None
            if method is None or attr in state:
                continue  # not there, or shadowed by someone else: left alone
            wrap = _ranged_context if context and context[0] else _ranged
            state[attr] = wrap(method, name, record_function)
            self._shadowed.append((obj, attr))

    def _off(self) -> None:
        shadowed, self._shadowed = self._shadowed, []
        for obj, attr in shadowed:
            obj.__dict__.pop(attr, None)
