"""A server's start on a thread of its own, so that the tests before the first one that needs it run
meanwhile (a vLLM start is 40-120 s on a 2-core host, much of it one core's work). Not a test module."""

from __future__ import annotations

import os
import threading
from types import MappingProxyType
from typing import Callable

from sidecar.devtools.stack import Stack

# The environment as the session began (this module is imported by tests/conftest.py, before any test
# runs): what a server started on a thread gets, whatever the test running meanwhile has set (a
# SIDECAR_TOKEN of a probe test's own kept every probe of a server started beside it out).
ENVIRON_AT_START = MappingProxyType(dict(os.environ))


class BackgroundStart:
    """``start()`` (default: ``stack.start()``) on a thread of its own; ``result()`` waits for it and
    raises what it raised. ``after``: another start this one begins after (whatever its outcome), so
    that a chain of starts takes one core, not every core at once. Its processes start from
    ``ENVIRON_AT_START`` unless the stack was given a ``base_env``."""

    def __init__(self, stack: Stack, start: Callable[[], object] | None = None, name: str = "stack-start",
                 after: "BackgroundStart | None" = None) -> None:
        self.stack = stack
        if stack.base_env is None:
            stack.base_env = ENVIRON_AT_START
        self._start = start or stack.start
        self._after = after
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if self._after is not None:
            self._after.wait()
        try:
            self._start()
        except BaseException as exc:  # noqa: BLE001 (raised by result())
            self._error = exc

    def wait(self) -> None:
        """Until the start has ended, started or failed."""
        self._thread.join()

    def result(self) -> Stack:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.stack

    def close(self) -> None:
        self._thread.join()
        self.stack.close()
