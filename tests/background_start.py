"""A server's start on a thread of its own, so that the tests before the first one that needs it run
meanwhile (a vLLM start is 40-120 s on a 2-core host, much of it one core's work). Not a test module."""

from __future__ import annotations

import threading
from typing import Callable

from sidecar.devtools.stack import Stack


class BackgroundStart:
    """``start()`` (default: ``stack.start()``) on a thread of its own; ``result()`` waits for it and
    raises what it raised. Its processes get the environment of the moment they are spawned: the tests
    that run beside the start must leave the environment alone, as they do."""

    def __init__(self, stack: Stack, start: Callable[[], object] | None = None, name: str = "stack-start") -> None:
        self.stack = stack
        self._start = start or stack.start
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._start()
        except BaseException as exc:  # noqa: BLE001 (raised by result())
            self._error = exc

    def result(self) -> Stack:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.stack

    def close(self) -> None:
        self._thread.join()
        self.stack.close()
