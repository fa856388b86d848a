"""One function per kind of sync, each making exactly one, on the line with a "sync: <op>" comment.

Plain torch on CPU tensors: run under SIDECAR_SYNC_TREAT_CPU_AS_DEVICE (treat_cpu_as_device=True).
``KINDS`` maps each function name to its (line, op), read from the markers in this file. The
synchronize kinds call whatever ``torch.cuda`` holds: tests replace the CUDA functions with no-ops
on hosts without CUDA, so the wrapper path is the one a GPU host takes.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

FILE = __file__


def _x():
    return torch.arange(1.0, 9.0).reshape(4, 2) - 4.0  # an op result: device memory


def item(x):
    return x.sum().item()  # sync: item


def bool_call(x):
    return bool(x.sum() > 0)  # sync: bool


def if_tensor(x):
    if x.sum():  # sync: bool
        return 1
    return 0


def float_call(x):
    return float(x.sum())  # sync: float


def int_call(x):
    return int(x.sum())  # sync: int


def cpu(x):
    return x.cpu()  # sync: cpu


def to_cpu(x):
    return x.to("cpu")  # sync: to_cpu


def to_cpu_keyword(x):
    return x.to(device="cpu", dtype=torch.float64)  # sync: to_cpu


def to_host_tensor(x):
    host = torch.zeros(1, dtype=torch.float64)
    return x.to(host)  # sync: to_cpu


def tolist(x):
    return x.tolist()  # sync: tolist


def numpy_forced(x):
    return x.numpy(force=True)  # sync: numpy


def nonzero(x):
    return torch.nonzero(x > 0)  # sync: nonzero


def where_one_argument(x):
    return torch.where(x > 0)  # sync: nonzero


def argwhere(x):
    return torch.argwhere(x)  # sync: nonzero


def masked_select(x):
    return x.masked_select(x > 0)  # sync: masked_select


def unique(x):
    return torch.unique(x)  # sync: unique


def unique_dim(x):
    return torch.unique(x, dim=0)  # sync: unique


def unique_consecutive(x):
    return torch.unique_consecutive(x)  # sync: unique_consecutive


def boolean_mask_index(x):
    return x[x > 0]  # sync: boolean_mask_index


def boolean_mask_assign(x):
    x[x > 0] = 0.0  # sync: boolean_mask_index


def repeat_interleave(x):
    repeats = (x[:, 0] > 0).long() + 1
    return torch.repeat_interleave(x, repeats, dim=0)  # sync: repeat_interleave


def equal(x):
    return torch.equal(x, x + 0)  # sync: equal


def copy_to_host(x):
    host = torch.empty(x.shape)
    host.copy_(x)  # sync: copy_to_host
    return host


def copy_to_pageable_non_blocking(x):
    host = torch.empty(x.shape)
    host.copy_(x, non_blocking=True)  # sync: copy_to_pageable_non_blocking
    return host


def cuda_synchronize(x):
    torch.cuda.synchronize()  # sync: synchronize


def event_synchronize(x):
    torch.cuda.Event.synchronize(object())  # sync: event.synchronize


def stream_synchronize(x):
    torch.cuda.Stream.synchronize(object())  # sync: stream.synchronize


def cpu_synchronize(x):
    torch.cpu.synchronize()  # sync: synchronize


def cpu_event_synchronize(x):
    event = torch.cpu.Event()
    event.record()
    event.synchronize()  # sync: event.synchronize


def no_sync(x):
    """Ordinary step code: none of it waits for the device."""
    w = torch.ones(2, 3)
    y = torch.relu(x @ w).softmax(-1)
    y = y[torch.tensor([0, 2])] * 2  # integer indexing
    y = y.to(torch.float64).float()  # dtype only
    _ = x.to("cpu", non_blocking=True)  # lands in pinned memory on a GPU: no wait
    _ = x.to(x.device), x.to(y), x.to(device=y.device)  # device-agnostic code stays on the device
    _ = torch.repeat_interleave(x, (x[:, 0] > 0).long() + 1, dim=0, output_size=6)
    host = torch.zeros(4)  # a host buffer: reading it is no sync
    host += 1
    _ = host[0].item(), host.tolist(), bool(host[1]), host.numpy()
    torch.topk(y, 1)
    torch.cat([y, y]).argmax(-1)
    return y


def _marked() -> dict[str, tuple[int, str]]:
    lines = Path(FILE).read_text().splitlines()
    out: dict[str, tuple[int, str]] = {}
    current = None
    for no, line in enumerate(lines, start=1):
        m = re.match(r"def (\w+)\(", line)
        if m:
            current = m.group(1)
        m = re.search(r"#\s*sync:\s*(\S+)\s*$", line)
        if m:
            out[current] = (no, m.group(1))
    return out


KINDS = _marked()
CUDA_ONLY = ("cuda_synchronize", "event_synchronize", "stream_synchronize")
