"""Class patching for engine integrations: idempotent, and one failing patch never stops the others.

An engine may load its plugins more than once per process, so a method that already carries ``MARK``
is left alone; a patch whose module or class is missing (another engine version) is logged and
skipped.
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Callable, Iterable

log = logging.getLogger(__name__)

MARK = "__inference_sidecar_wrapped__"
Patch = tuple[str, str, str, Callable[[Callable], Callable]]  # module, class, attribute, wrapper factory


def patch(cls: type, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``cls.name`` (defined on ``cls`` itself) by ``make(original)``, once."""
    original = cls.__dict__.get(name)
    if original is None or getattr(original, MARK, False):
        return
    wrapped = functools.wraps(original)(make(original))
    setattr(wrapped, MARK, True)
    setattr(cls, name, wrapped)


def install(patches: Iterable[Patch]) -> None:
    for module_name, class_name, attr, make in patches:
        try:
            patch(getattr(importlib.import_module(module_name), class_name), attr, make)
        except Exception as exc:
            log.warning("inference-sidecar: cannot patch %s.%s.%s: %s", module_name, class_name, attr, exc)
