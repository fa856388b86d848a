"""A stand-in for the CUDA profiler API and NVTX (sidecar/probe/capture/nsys.py ``CudaCalls``): it records
every call in order, so a test on a host without CUDA sees exactly what an nsys capture would have
called; with ``path`` each call is also appended to that file as one line (a stand-in engine's)."""

from __future__ import annotations

import threading


class RecordingCalls:
    def __init__(self, has_context: bool = True, path: str | None = None, fail_on: str | None = None) -> None:
        self.calls: list[tuple] = []
        self.threads: set[int] = set()
        self._context = has_context
        self._path = path
        self._fail_on = fail_on  # "start", "stop", "push" or "pop": that call raises
        self._lock = threading.Lock()

    def _note(self, *call) -> None:
        with self._lock:
            self.calls.append(call)
            self.threads.add(threading.get_ident())
            if self._path is not None:
                with open(self._path, "a") as f:
                    f.write(" ".join(str(c) for c in call) + "\n")
        if call[0] == self._fail_on:
            raise RuntimeError(f"{call[0]} failed (stand-in)")

    def has_context(self) -> bool:
        return self._context

    def start(self) -> None:
        self._note("start")

    def stop(self) -> None:
        self._note("stop")

    def push(self, name: str) -> None:
        self._note("push", name)

    def pop(self) -> None:
        self._note("pop")


def balanced(calls: list[tuple]) -> bool:
    """Every push popped, never a pop without a push."""
    depth = 0
    for call in calls:
        depth += {"push": 1, "pop": -1}.get(call[0], 0)
        if depth < 0:
            return False
    return depth == 0


def read_log(path) -> list[tuple]:
    """The calls a stand-in engine appended to ``path``: ("push", "step 12"), ("start",), ..."""
    calls = []
    for line in open(path).read().splitlines():
        name, _, arg = line.partition(" ")
        calls.append((name, arg) if arg else (name,))
    return calls
