"""Which aten calls make the host wait for the device, and what each is called in a report.

``classify`` sees every aten call made on the armed thread while a step is scanned and answers the
report's ``op`` name, or None. It only looks at the call, its arguments and ``is_device`` (which
decides what counts as device memory; see detector.py).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

aten = torch.ops.aten

IsDevice = Callable[[torch.Tensor], bool]

# Ops whose output size depends on the data: the host must read a count back from the device.
_DATA_DEPENDENT = {
    aten.nonzero.default: "nonzero",
    aten.nonzero.out: "nonzero",
    aten.masked_select.default: "masked_select",
    aten.masked_select.out: "masked_select",
    aten._unique2.default: "unique",
    aten._unique.default: "unique",
    aten.unique_dim.default: "unique",
    aten.unique_consecutive.default: "unique_consecutive",
    # Composite ops: under torch.inference_mode (how engines run) the mode sees them undecomposed.
    aten.argwhere.default: "nonzero",
    aten.nonzero_numpy.default: "nonzero",
    aten.where.default: "nonzero",  # torch.where(condition): the one-argument form
    aten.bincount.default: "bincount",
}
# Ops that return a Python value read from the tensor (composite forms of _local_scalar_dense).
_SCALAR_READS = {
    aten._local_scalar_dense.default: "item",
    aten.item.default: "item",
    aten.is_nonzero.default: "bool",
    aten.equal.default: "equal",
    aten.allclose.default: "allclose",
}
_TO = (aten.to.device, aten.to.dtype_layout, aten.to.other)
_BOOL_INDEX = (aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default)
_MASK_DTYPES = (torch.bool, torch.uint8)

# Factory calls: in TREAT_CPU_AS_DEVICE mode what they allocate stands for host memory.
FACTORIES = frozenset(
    {
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.zeros.default,
        aten.ones.default,
        aten.full.default,
        aten.arange.default,
        aten.arange.start,
        aten.arange.start_step,
        aten.scalar_tensor.default,
        aten.lift_fresh.default,
        aten.lift_fresh_copy.default,
    }
)

WATCHED = frozenset(
    {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor, aten._to_copy.default, aten.copy_.default}
    | set(_SCALAR_READS)
    | set(_TO)
    | set(_DATA_DEPENDENT)
    | set(_BOOL_INDEX)
)


def classify(func, args: tuple, kwargs: dict, is_device: IsDevice) -> Optional[str]:
    name = _SCALAR_READS.get(func)
    if name is not None:
        return name if is_device(args[0]) else None
    name = _DATA_DEPENDENT.get(func)
    if name is not None:
        return name if is_device(args[0]) else None
    if func in _BOOL_INDEX:
        return "boolean_mask_index" if is_device(args[0]) and _has_mask(args[1]) else None
    if func is aten.repeat_interleave.Tensor or func is aten.repeat_interleave.self_Tensor:
        # Without output_size the op reads the sum of the repeats back to size its output.
        repeats = args[0] if func is aten.repeat_interleave.Tensor else args[1]
        return "repeat_interleave" if kwargs.get("output_size") is None and is_device(repeats) else None
    if func is aten._to_copy.default:
        return _to_copy(args[0], kwargs, is_device)
    if func in _TO:
        return _to(func, args, kwargs, is_device)
    if func is aten.copy_.default:
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
        return copy_kind(args[0], args[1], non_blocking, is_device)
    return None


def copy_kind(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool, is_device: IsDevice) -> Optional[str]:
    """A copy from device memory into host memory, blocking or "non-blocking" into pageable memory."""
    if dst.device.type != "cpu" or is_device(dst) or not is_device(src):
        return None
    if not non_blocking:
        return "copy_to_host"
    # A non-blocking copy into pinned memory is truly asynchronous; into pageable memory the host
    # still waits for it (vLLM #53491).
    return None if _pinned(dst) else "copy_to_pageable_non_blocking"


def _to_copy(src: torch.Tensor, kwargs: dict[str, Any], is_device: IsDevice) -> Optional[str]:
    device = kwargs.get("device")
    # Only a real device source: a CPU→CPU conversion at this level is torch's own (numpy() calls
    # one); the Python-level cpu() / to("cpu") wrappers cover what user code writes, in every mode.
    if device is None or torch.device(device).type != "cpu" or src.device.type == "cpu" or not is_device(src):
        return None
    # torch allocates the result of a non-blocking device→CPU _to_copy in pinned memory: no wait.
    return None if kwargs.get("non_blocking") else "copy_to_host"


def _to(func, args: tuple, kwargs: dict[str, Any], is_device: IsDevice) -> Optional[str]:
    """The composite ``aten.to`` overloads, seen undecomposed under inference_mode."""
    if func is aten.to.other:
        device, non_blocking = args[1].device, args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    elif func is aten.to.device:
        device, non_blocking = args[1], args[3] if len(args) > 3 else kwargs.get("non_blocking", False)
    else:
        device, non_blocking = kwargs.get("device"), kwargs.get("non_blocking", False)
    return _to_copy(args[0], {"device": device, "non_blocking": non_blocking}, is_device)


def _has_mask(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES for i in indices)


def _pinned(t: torch.Tensor) -> bool:
    try:
        return bool(t.is_pinned())
    except RuntimeError:  # no accelerator: nothing is pinned
        return False
