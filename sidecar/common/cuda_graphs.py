"""Whether an engine replayed CUDA graphs during a job's window: what a job that cannot see inside one
must say (module timing, a sync scan), instead of reporting zeros for what it did not see.

A replayed graph runs its kernels on the device with no Python and no ATen op on the host: forward
hooks do not run, no op reaches the sync detector (sidecar/syncs/), only ``cudaGraphLaunch`` does. vLLM
replays graphs for its decode steps by default. ``GraphReplays`` wraps ``torch.cuda.CUDAGraph.replay``
(a Python method, in every torch build) while a job's window is open and counts the calls, and at each
step's end whether the step replayed any: a counter increment per replay, two integer reads per step,
and nothing at all outside the window (``install`` at the window's first step, ``uninstall`` at its
end, both on the step thread). Any engine's replays are seen this way, whichever of its classes calls
``replay``; a graph launched another way (``torch._C._CUDAGraph.replay`` called directly, CUDA from
C++) is not counted.

No module state: the wrapper lives on the class only while installed. Two counters installed at
once (a sync scan and a module timing never are: one job at a time) each wrap what they found; one
uninstalled out of order leaves the other's wrapper in place and its own passing calls through.
No import of torch here until ``install``: ``graph_class`` is for tests (a stand-in class).
"""

from __future__ import annotations

from typing import Any


def _graph_class() -> Any:
    import torch

    return torch.cuda.CUDAGraph


class GraphReplays:
    """Counts ``replay`` calls of ``graph_class`` (default ``torch.cuda.CUDAGraph``) while installed."""

    def __init__(self, graph_class: Any = None) -> None:
        self._class = graph_class
        self.replays = 0  # replays seen while installed
        self.steps = 0  # steps (ended while installed) in which at least one replay happened
        self._at_step_begin = 0
        self._original: Any = None
        self._wrapper: Any = None
        self._owned = False  # replay was the class's own (not inherited): put back, not deleted

    def install(self) -> None:
        if self._wrapper is not None:
            return
        cls = self._class if self._class is not None else _graph_class()
        self._class = cls
        original = cls.__dict__.get("replay")
        if original is None:  # a class that inherits replay: wrap the attribute it finds
            original = getattr(cls, "replay")
        counter = self

        def replay(graph: Any, *args: Any, **kwargs: Any) -> Any:
            if counter._wrapper is not None:
                counter.replays += 1
            return original(graph, *args, **kwargs)

        self._original, self._wrapper = original, replay
        self._owned = "replay" in cls.__dict__
        cls.replay = replay

    def uninstall(self) -> None:
        wrapper, self._wrapper = self._wrapper, None
        if wrapper is None:
            return
        cls = self._class
        if cls.__dict__.get("replay") is wrapper:  # else wrapped again since: ours now passes calls through
            if self._owned:
                cls.replay = self._original
            else:
                del cls.replay

    def step_began(self) -> None:
        self._at_step_begin = self.replays

    def step_ended(self) -> None:
        if self.replays != self._at_step_begin:
            self.steps += 1
            self._at_step_begin = self.replays
