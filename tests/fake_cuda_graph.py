"""``torch.cuda.CUDAGraph``'s stand-in on a host without CUDA (tests/fake_engine.py ``--cuda-graph`` on CPU):
``capture(work)`` keeps the work, ``replay()`` runs it. As with a real graph, what a replay runs is no call
of the model's modules (their forward hooks do not run) and no op of the engine's Python code; only the
call of ``replay`` is there to see, which is what sidecar/common/cuda_graphs.py counts."""

from __future__ import annotations

from typing import Callable


class StandInGraph:
    def __init__(self) -> None:
        self._work: Callable[[], object] | None = None

    def capture(self, work: Callable[[], object]) -> None:
        self._work = work

    def replay(self) -> None:
        if self._work is None:
            raise RuntimeError("replay of a graph never captured")
        self._work()
