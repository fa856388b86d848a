"""What one trace event looks like to the analyser, and which events it cares about.

Events are decoded straight into structs, one type per phase (``ph`` is the union's tag): msgspec
fills only the fields named here and skips every other key (``External id``, ``grid``, shapes, ...)
while scanning, which is what keeps decoding fast and small. Every field but ``ph`` is optional
because real traces omit them freely.

Timestamps: in the Chrome trace format ``ts`` and ``dur`` are always microseconds; nanosecond
traces write them as fractional microseconds (``12.345``). ``displayTimeUnit`` only changes how a
viewer displays them, so it is never used to rescale (and it may come after ``traceEvents``).
"""

from __future__ import annotations

from enum import IntEnum
from typing import Optional, Union

import msgspec

Scalar = Union[int, float, str, None]


class RawArgs(msgspec.Struct, gc=False):
    """The few ``args`` members any analysis reads."""

    device: Scalar = None
    stream: Scalar = None
    correlation: Scalar = None
    bytes: Scalar = None
    name: Scalar = None  # process_name / thread_name metadata
    labels: Scalar = None  # process_labels metadata ("CPU", "GPU 0")


class CompleteEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete event (``"ph": "X"``): every op, kernel, copy and runtime call Kineto writes.
    Only the fields the analyser reads."""

    cat: Optional[str] = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: Optional[float] = None
    dur: Optional[float] = None
    args: Optional[RawArgs] = None


class MetadataEvent(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
    """``"ph": "M"``: process and thread names and labels."""

    name: Scalar = None
    pid: Scalar = None
    args: Optional[RawArgs] = None


# Every other phase of the Trace Event Format (duration B/E, instant i/I, counter C, async b/n/e and
# the deprecated S/T/p/F, flow s/t/f, sample P, object N/O/D, memory dump V/v, mark R, clock sync c,
# context ( and )). Kineto's flow arrows and instant events are 40 % of a training trace's events:
# decoding them into structs with only ``cat`` (kept to count events of a known category that are
# not complete events) makes the whole decode about 25 % faster than one struct with every field.
OTHER_PHASES = "BEiICbneSTpFstfPNODVvRc()"
OTHER_EVENT_TYPES = tuple(
    msgspec.defstruct(f"Phase_{ord(ph)}_Event", [("cat", Optional[str], None)], gc=False, tag_field="ph", tag=ph)
    for ph in OTHER_PHASES
)
# One entry of traceEvents. An entry whose ph is missing or outside the format is not decodable as
# any of these and is counted as skipped.
RawEvent = Union[(CompleteEvent, MetadataEvent, *OTHER_EVENT_TYPES)]


class Kind(IntEnum):
    """What an event is to the analyser. Host kinds are below ``KERNEL``; device kinds from it on."""

    OP = 0  # cpu_op: an ATen operator or other instrumented CPU op
    ANNOTATION = 1  # user_annotation: record_function ranges, ProfilerStep#n
    PYTHON = 2  # python_function (with_stack=True)
    RUNTIME = 3  # cuda_runtime / cuda_driver (and the hip* calls ROCm traces file under them)
    KERNEL = 10
    MEMCPY = 11
    MEMSET = 12


# Category names, lower-cased. Old PyTorch versions wrote "Operator", "Runtime", "Kernel", "Memcpy".
CATEGORY_KIND: dict[str, Kind] = {
    "cpu_op": Kind.OP,
    "operator": Kind.OP,
    "user_annotation": Kind.ANNOTATION,
    "python_function": Kind.PYTHON,
    "cuda_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.RUNTIME,
    "runtime": Kind.RUNTIME,
    "kernel": Kind.KERNEL,
    "gpu_memcpy": Kind.MEMCPY,
    "memcpy": Kind.MEMCPY,
    "gpu_memset": Kind.MEMSET,
    "memset": Kind.MEMSET,
}


def category_table() -> dict[object, int]:
    """Category → kind for every spelling met in practice, so the hot loop needs one dict lookup
    instead of lower-casing each category string."""
    table: dict[object, int] = {}
    for cat, kind in CATEGORY_KIND.items():
        for spelling in (cat, cat.capitalize(), cat.upper(), cat.title()):
            table[spelling] = int(kind)  # plain ints: cheaper to compare in the hot loop
    return table


STEP_PREFIX = "ProfilerStep#"


def step_number(name: str) -> Optional[int]:
    """``ProfilerStep#12`` → 12; anything else → None."""
    if not name.startswith(STEP_PREFIX):
        return None
    digits = name[len(STEP_PREFIX) :]
    return int(digits) if digits.isdigit() else None


_API_SUFFIXES = ("_ptsz", "_ptds", "_spt")


def api_base_name(name: str) -> str:
    """Strip CUPTI's version and per-thread-stream suffixes: ``cudaMemcpyAsync_ptsz`` and
    ``cuMemcpyDtoH_v2`` name the same API as ``cudaMemcpyAsync`` / ``cuMemcpyDtoH``."""
    for suffix in _API_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    head, sep, tail = name.rpartition("_v")
    if sep and head and tail.isdigit():
        name = head
    return name


def is_launch(name: str) -> bool:
    """Runtime/driver calls that put work on the GPU: cudaLaunchKernel, cuLaunchKernel(Ex),
    cudaLaunchKernelExC, cudaLaunchCooperativeKernel, cudaGraphLaunch, hipLaunchKernel,
    hipExtModuleLaunchKernel, hipModuleLaunchKernel, hipGraphLaunch, ..."""
    return "Launch" in name and (name.startswith("cu") or name.startswith("hip"))


_COLLECTIVE_MARKERS = ("nccl", "rccl")


def is_collective(name: str) -> bool:
    """NCCL / RCCL kernels (``ncclKernel_AllReduce_RING_LL_Sum_float``, ``ncclDevKernel_...``)."""
    low = name[:32].lower()
    return any(marker in low for marker in _COLLECTIVE_MARKERS)


# Host-side collectives, for ranks whose collectives run on the CPU (gloo, vLLM's shared-memory
# communicator). Point-to-point ops (send, recv) are left out: the two sides issue different ops.
_HOST_POINT_TO_POINT = ("send", "recv")
_SHM_COLLECTIVES = frozenset(("_C::shm_allreduce", "_C::shm_all_gather", "_C::shm_gather"))


def host_collective(name: str) -> Optional[str]:
    """What a host event is as a collective, None when it is none:

    * ``"work"``: gloo's range for the work of one collective (``gloo:all_reduce``,
      ``gloo:all_gather``), recorded on a gloo thread from the work's start to its completion, so it
      lasts until the last rank has arrived (as a NCCL kernel does);
    * ``"op"``: the call that issued a collective, ``c10d::allreduce_``, ``c10d::_allgather_base_``,
      ... (with gloo only its enqueueing: the wait is in ``work.wait()``, outside the op);
    * ``"shm"``: vLLM's shared-memory collectives (``_C::shm_allreduce``), which wait for the other
      ranks inside the call."""
    if name.startswith("gloo:"):
        return None if any(p in name for p in _HOST_POINT_TO_POINT) else "work"
    if name.startswith("c10d::"):
        return None if any(p in name for p in _HOST_POINT_TO_POINT) else "op"
    if name in _SHM_COLLECTIVES:
        return "shm"
    return None


def memcpy_direction(name: str) -> str:
    """``Memcpy DtoH (Device -> Pageable)`` → ``DtoH``; ROCm uses the same spelling."""
    parts = name.split()
    if len(parts) >= 2 and parts[0] == "Memcpy":
        return parts[1]
    return "other"


def is_pageable_dtoh(name: str) -> bool:
    """A device-to-host copy into pageable memory: the host waits for it even when it was issued
    with cudaMemcpyAsync, so it is a synchronisation in disguise."""
    return memcpy_direction(name) == "DtoH" and "Pageable" in name
