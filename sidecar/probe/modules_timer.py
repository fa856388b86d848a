"""Time every ``nn.Module`` of a model with forward hooks, then take every hook out again.

``ModuleTimer(model, cuda)``: ``install()`` puts a forward pre-hook and a forward hook (called even
when the forward raises) on each module of ``model.named_modules()``; ``remove()`` removes every one
of them through its handle; ``rows()`` gives one row per module that ran: its path, its class, calls,
total and self time in ns. Self time is the total less the calls of hooked modules directly inside,
so the self times of all calls add up to the time of the outermost calls.

The clock: on CUDA a pair of timing events per call, recorded on the current stream (the time the
device spent between the module's start and end, which a host clock cannot see when launches are
asynchronous); read once the job is over (``rows`` waits for the last event, off the step thread).
On CPU the host clock (``perf_counter_ns``), read in the hooks themselves.

The hooks only count calls on the thread that installed them (the engine's step thread): a module
called from elsewhere meanwhile is not this job's step. Nothing here is process-global: the hooks are
the modules' own (``register_forward_pre_hook``), never torch's global module hooks, and
``hook_count`` lets the caller check that none is left.
"""

from __future__ import annotations

from threading import get_ident
from time import perf_counter_ns
from typing import Any


def hook_count(model: Any) -> int:
    """Forward and forward-pre hooks on ``model`` and every module inside it."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


class ModuleTimer:
    def __init__(self, model: Any, cuda: bool = False, event: Any = None) -> None:
        """``event``: the timing-event class on CUDA (default ``torch.cuda.Event``)."""
        self._model = model
        self._cuda = cuda or event is not None
        self._paths: list[str] = []
        self._types: list[str] = []
        self._handles: list[Any] = []
        self._thread: int | None = None
        # Per module index, [calls, total_ns, self_ns, outer_ns] (outer: calls with no timed module
        # around them). CPU: the stack holds [index, start_ns, child_ns].
        self._totals: list[list[int]] = []
        self._stack: list[list] = []
        # CUDA: one entry per call, [index, start event, end event, parent call or -1]; the stack holds
        # call numbers.
        self._calls: list[list] = []
        self._event = event

    @property
    def handles(self) -> list[Any]:
        return self._handles

    def install(self) -> None:
        """On the thread whose calls are to be timed (the step thread)."""
        if self._cuda and self._event is None:
            import torch

            self._event = torch.cuda.Event
        self._thread = get_ident()
        for path, module in self._model.named_modules():
            k = len(self._paths)
            self._paths.append(path)
            self._types.append(type(module).__name__)
            self._totals.append([0, 0, 0, 0])
            pre, post = (self._cuda_hooks if self._cuda else self._cpu_hooks)(k)
            self._handles.append(module.register_forward_pre_hook(pre))
            self._handles.append(module.register_forward_hook(post, always_call=True))

    def remove(self) -> None:
        """Every hook this timer put in, out; safe to call twice."""
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()
        self._stack.clear()

    # -- the hooks (the model's forward, on the step thread) -----------------------------------------
    def _cpu_hooks(self, k: int):
        stack, totals, thread = self._stack, self._totals, get_ident

        def pre(_module, _args):
            if thread() == self._thread:
                stack.append([k, perf_counter_ns(), 0])

        def post(_module, _args, _out):
            if thread() != self._thread or not stack or stack[-1][0] != k:
                return  # not a call this timer saw begin (another thread's, or one begun before install)
            now = perf_counter_ns()
            _, start, child = stack.pop()
            spent = now - start
            row = totals[k]
            row[0] += 1
            row[1] += spent
            row[2] += max(spent - child, 0)
            if stack:
                stack[-1][2] += spent
            else:
                row[3] += spent

        return pre, post

    def _cuda_hooks(self, k: int):
        stack, calls, thread = self._stack, self._calls, get_ident

        def pre(_module, _args):
            if thread() == self._thread:
                start = self._event(enable_timing=True)
                start.record()
                calls.append([k, start, None, stack[-1] if stack else -1])
                stack.append(len(calls) - 1)

        def post(_module, _args, _out):
            if thread() != self._thread or not stack or calls[stack[-1]][0] != k:
                return
            end = self._event(enable_timing=True)
            end.record()
            calls[stack.pop()][2] = end

        return pre, post

    # -- the result (off the step thread) --------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """One row per module that ran, in the model's order: path, type, calls, total_ns, self_ns,
        outer_ns (the part of total_ns in calls with no timed module around them: the forward)."""
        if self._cuda:
            self._resolve_events()
        return [{"path": self._paths[k], "type": self._types[k], "calls": calls, "total_ns": total, "self_ns": own,
                 "outer_ns": outer} for k, (calls, total, own, outer) in enumerate(self._totals) if calls]

    def _resolve_events(self) -> None:
        done = [c for c in self._calls if c[2] is not None]
        if not done:
            return
        spent = [0] * len(self._calls)
        child = [0] * len(self._calls)
        for i, (_k, start, end, parent) in enumerate(self._calls):
            if end is None:
                continue
            end.synchronize()  # this thread waits, never the step thread; at once when it has passed
            spent[i] = int(start.elapsed_time(end) * 1e6)  # ms → ns
            if parent >= 0:
                child[parent] += spent[i]
        for i, (k, _start, end, parent) in enumerate(self._calls):
            if end is None:
                continue
            row = self._totals[k]
            row[0] += 1
            row[1] += spent[i]
            row[2] += max(spent[i] - child[i], 0)
            if parent < 0:
                row[3] += spent[i]
        self._calls.clear()
