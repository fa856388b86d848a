"""Syncs that never reach torch's dispatcher, caught by wrapping Python attributes while armed.

``tolist()`` and ``numpy()`` read memory without an aten call; ``cpu()`` / ``to("cpu")`` of a CPU
tensor are no-ops (they matter in TREAT_CPU_AS_DEVICE mode); ``synchronize`` of the device, an event
or a stream is no aten op at all. ``item()`` and the dunders that read a scalar (``bool(t)``,
``if t:``, ``float(t)``, ``int(t)``) do reach the dispatcher as ``_local_scalar_dense``; they are
wrapped too so the report can name the operation the code wrote.

A ``PatchSet`` installs wrappers when armed and removes them when disarmed. Each wrapper acts only
on the thread that armed it and passes every other call straight through. If another patch set was
installed on top in the meantime, the wrapper is left in place as a pass-through rather than tearing
the other one off.
"""

from __future__ import annotations

import functools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

log = logging.getLogger(__name__)

_ABSENT = object()


@dataclass(frozen=True)
class Target:
    """One attribute to wrap: ``owner()`` returns the object (module or class) holding ``attr``.

    ``kind``: ``tensor`` wrappers get the tensor as first argument and ask ``decide(self, args,
    kwargs)`` for the op name (None: not a sync); ``call`` wrappers always report ``op``."""

    owner: Callable[[], Any]
    attr: str
    op: str
    kind: str = "call"
    decide: Optional[Callable[..., Optional[str]]] = None


class PatchSet:
    def __init__(self, targets: tuple[Target, ...], on_sync: Callable[[str, Callable, tuple, dict], Any], thread_id: int) -> None:
        self._targets = targets
        self._on_sync = on_sync
        self._thread_id = thread_id
        self._installed: list[tuple[Any, str, Any, Any]] = []  # owner, attr, previous (or _ABSENT), wrapper
        self.enabled = False

    def install(self) -> None:
        for target in self._targets:
            try:
                owner = target.owner()
            except Exception:
                continue  # e.g. no such class in this torch build
            if owner is None or not hasattr(owner, target.attr):
                continue
            previous = owner.__dict__.get(target.attr, _ABSENT) if hasattr(owner, "__dict__") else _ABSENT
            original = getattr(owner, target.attr)
            wrapper = self._wrap(target, original)
            try:
                setattr(owner, target.attr, wrapper)
            except (TypeError, AttributeError) as exc:  # an immutable C type
                log.debug("inference-sidecar: cannot wrap %s.%s: %s", owner, target.attr, exc)
                continue
            self._installed.append((owner, target.attr, previous, wrapper))
        self.enabled = True

    def remove(self) -> None:
        self.enabled = False
        for owner, attr, previous, wrapper in reversed(self._installed):
            current = owner.__dict__.get(attr, _ABSENT) if isinstance(owner, type) else getattr(owner, attr, _ABSENT)
            if current is not wrapper:
                continue  # someone wrapped it after us: ours stays as a disabled pass-through
            if previous is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, previous)
        self._installed.clear()

    def _wrap(self, target: Target, original: Callable) -> Callable:
        patch_set = self
        thread_id = self._thread_id
        on_sync = self._on_sync
        get_ident = threading.get_ident

        if target.kind == "tensor":
            decide = target.decide

            def tensor_wrapper(tensor, *args, **kwargs):
                if patch_set.enabled and get_ident() == thread_id:
                    try:
                        op = decide(tensor, args, kwargs)
                    except Exception:  # arguments the original will reject: let it say so
                        op = None
                    if op is not None:
                        return on_sync(op, original, (tensor, *args), kwargs)
                return original(tensor, *args, **kwargs)

            wrapper = tensor_wrapper
        else:
            op = target.op

            def call_wrapper(*args, **kwargs):
                if patch_set.enabled and get_ident() == thread_id:
                    return on_sync(op, original, args, kwargs)
                return original(*args, **kwargs)

            wrapper = call_wrapper
        try:
            functools.update_wrapper(wrapper, original)
        except (AttributeError, TypeError):
            pass
        return wrapper


def target_device(args: tuple, kwargs: dict) -> tuple[Optional[torch.device], Any]:
    """The device a ``Tensor.to(...)`` call moves to (None when it only changes the dtype), and the
    argument that named it (a str, a torch.device, a tensor or a device index)."""
    given = kwargs.get("device")
    if given is None:
        for a in args:
            if isinstance(a, (str, torch.device, torch.Tensor)) or (isinstance(a, int) and not isinstance(a, bool)):
                given = a
                break
    if given is None:
        return None, None
    if isinstance(given, torch.Tensor):
        return given.device, given
    if isinstance(given, int):
        return torch.device("cuda", given), given
    return torch.device(given), given


def non_blocking_flag(args: tuple, kwargs: dict) -> bool:
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return any(isinstance(a, bool) and a for a in args[:2])
