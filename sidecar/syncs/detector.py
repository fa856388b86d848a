"""The detector: catches every host-device sync made on the thread that armed it.

Two nets, both active only between ``step_begin`` and ``step_end`` on the armed thread:

* a ``TorchDispatchMode`` (torch keeps its mode stack per thread, so other threads' ops never reach
  it) sees each aten call and asks ops.py whether it syncs;
* a ``PatchSet`` (patches.py) wraps what never reaches the dispatcher.

Each sync is timed (``perf_counter_ns`` around the call: the time the host was blocked) and
attributed to a site (sites.py). A sync inside another one (``_local_scalar_dense`` under a wrapped
``item()``) is counted once, by the outer one.

What counts as device memory: any tensor not on the CPU. With ``treat_cpu_as_device`` (setting
``SIDECAR_SYNC_TREAT_CPU_AS_DEVICE=1``) CPU tensors count as device tensors too, except tensors whose
storage a factory call (torch.empty / zeros / ones / full / arange / torch.tensor) allocated during
the current scanned step: they stand for the host buffers a GPU program would allocate on the CPU.
Tensors that existed before the step (an engine's preallocated buffers) count as device memory.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from . import ops
from .patches import PatchSet, Target, non_blocking_flag, target_device
from .settings import treat_cpu_as_device as _treat_from_env
from .sites import Site, SiteLocator


@dataclass
class SiteStats:
    site: Site
    op: str
    count: int = 0
    blocked_ns: int = 0
    first_step: int = -1
    last_step: int = -1


class _Mode(TorchDispatchMode):
    def __init__(self, detector: "SyncDetector") -> None:
        super().__init__()
        self._detector = detector

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._detector._dispatch(func, args, kwargs or {})


class SyncDetector:
    """Arm on the thread to watch; then ``step_begin(n)`` / ``step_end()`` around each step."""

    def __init__(self, treat_cpu_as_device: Optional[bool] = None, locator: Optional[SiteLocator] = None) -> None:
        self.treat_cpu_as_device = _treat_from_env() if treat_cpu_as_device is None else treat_cpu_as_device
        self._locator = locator or SiteLocator()
        self._stats: dict[tuple, SiteStats] = {}
        self._host: dict[int, StorageWeakRef] = {}  # storage address -> host buffer (TREAT mode)
        self._inside = 0
        self._step = -1
        self._mode: Optional[_Mode] = None
        self._patches: Optional[PatchSet] = None
        self.thread_id: Optional[int] = None
        self.active = False
        self.errors = 0  # internal failures, each swallowed so the engine's step goes on

    # -- lifecycle (all on the watched thread) ------------------------------------------------------
    def arm(self) -> None:
        if self._patches is not None:
            return
        self.thread_id = threading.get_ident()
        self._patches = PatchSet(self._targets(), self._on_sync, self.thread_id)
        self._patches.install()
        self._patches.enabled = False

    def disarm(self) -> None:
        if self.active:
            self.step_end()
        if self._patches is not None:
            self._patches.remove()
            self._patches = None

    def step_begin(self, step: int) -> None:
        if self.active or self._patches is None or threading.get_ident() != self.thread_id:
            return
        self._step = step
        self._mode = _Mode(self)
        self._mode.__enter__()
        self._patches.enabled = True
        self.active = True

    def step_end(self) -> None:
        if not self.active:
            return
        self.active = False
        self._patches.enabled = False
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        self._host.clear()

    def stats(self) -> list[SiteStats]:
        return list(self._stats.values())

    # -- what counts as device memory -------------------------------------------------------------
    def is_device(self, t: torch.Tensor) -> bool:
        kind = t.device.type
        if kind == "cpu":
            if not self.treat_cpu_as_device:
                return False
            storage = t.untyped_storage()
            host = self._host.get(storage.data_ptr())
            return host is None or host.expired()  # expired: freed, and its address reused
        return kind != "meta"

    # -- the two nets -------------------------------------------------------------------------------
    def _dispatch(self, func, args: tuple, kwargs: dict) -> Any:
        if self._inside or not self.active:
            return func(*args, **kwargs)
        if func in ops.WATCHED:
            try:
                op = ops.classify(func, args, kwargs, self.is_device)
            except Exception:  # an argument shape we did not foresee: never break the step
                self.errors += 1
                op = None
            if op is not None:
                return self._timed(op, func, args, kwargs, sys._getframe(1))
        elif self.treat_cpu_as_device and func in ops.FACTORIES:
            out = func(*args, **kwargs)
            try:
                storage = out.untyped_storage()
                if storage.data_ptr():
                    self._host[storage.data_ptr()] = StorageWeakRef(storage)
            except Exception:
                self.errors += 1
            return out
        return func(*args, **kwargs)

    def _on_sync(self, op: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        if self._inside:
            return original(*args, **kwargs)
        return self._timed(op, original, args, kwargs, sys._getframe(2))

    def _timed(self, op: str, call: Callable, args: tuple, kwargs: dict, frame) -> Any:
        self._inside += 1
        start = time.perf_counter_ns()
        try:
            return call(*args, **kwargs)
        finally:
            blocked = time.perf_counter_ns() - start
            self._inside -= 1
            try:
                self._record(op, blocked, frame)
            except Exception:
                self.errors += 1

    def _record(self, op: str, blocked_ns: int, frame) -> None:
        frame = self._locator.site_frame(frame)
        if frame is None:
            return  # entirely inside torch or this project
        # The site is described (path, phase) once; later hits cost a dict lookup. The phase is
        # the one of the first call stack seen at that line.
        key = (frame.f_code, frame.f_lineno, op)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = SiteStats(self._locator.describe(frame), op, first_step=self._step)
        stats.count += 1
        stats.blocked_ns += blocked_ns
        stats.last_step = self._step

    # -- what is wrapped ----------------------------------------------------------------------------
    def _targets(self) -> tuple[Target, ...]:
        is_device = self.is_device

        def when_device(op: str) -> Callable[..., Optional[str]]:
            return lambda t, args, kwargs: op if is_device(t) else None

        def to_host(t, args, kwargs) -> Optional[str]:
            device, given = target_device(args, kwargs)
            if device is None or device.type != "cpu" or not is_device(t) or non_blocking_flag(args, kwargs):
                return None  # a non-blocking copy to the CPU lands in pinned memory: no wait
            if t.device.type != "cpu":
                return "to_cpu"
            # TREAT_CPU_AS_DEVICE: x.to(self.device) is how device-agnostic code stays on its
            # device, which is the CPU here. Only a target written as a string ("cpu") or a host
            # tensor asks for the host.
            if isinstance(given, str) or (isinstance(given, torch.Tensor) and not is_device(given)):
                return "to_cpu"
            return None

        def numpy_forced(t, args, kwargs) -> Optional[str]:
            force = kwargs.get("force", args[0] if args else False)
            return "numpy" if force and is_device(t) else None

        tensor = lambda: torch.Tensor  # noqa: E731
        targets = [
            Target(tensor, "item", "item", "tensor", when_device("item")),
            Target(tensor, "__bool__", "bool", "tensor", when_device("bool")),
            Target(tensor, "__float__", "float", "tensor", when_device("float")),
            Target(tensor, "__int__", "int", "tensor", when_device("int")),
            Target(tensor, "tolist", "tolist", "tensor", when_device("tolist")),
            # numpy() raises on a device tensor unless force=True (which copies it to the host),
            # so code calling it without force holds a host tensor: never a sync.
            Target(tensor, "numpy", "numpy", "tensor", numpy_forced),
            Target(tensor, "cpu", "cpu", "tensor", when_device("cpu")),
            Target(tensor, "to", "to_cpu", "tensor", to_host),
            Target(lambda: torch.cuda, "synchronize", "synchronize"),
            Target(lambda: torch.cuda.Event, "synchronize", "event.synchronize"),
            Target(lambda: torch.cuda.Stream, "synchronize", "stream.synchronize"),
            Target(lambda: torch.accelerator, "synchronize", "synchronize"),
        ]
        if self.treat_cpu_as_device:
            # The CPU twins of the device-agnostic calls: what device-agnostic code calls here.
            targets += [
                Target(lambda: torch.cpu, "synchronize", "synchronize"),
                Target(lambda: torch.cpu.Event, "synchronize", "event.synchronize"),
            ]
        return tuple(targets)
