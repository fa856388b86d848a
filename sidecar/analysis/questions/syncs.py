"""Host-side synchronisation found in a trace: where the CPU waited for the GPU, and what it cost.

Three kinds:

* ``sync``: an explicit synchronize call (cudaDeviceSynchronize, cudaStreamSynchronize,
  cudaEventSynchronize, their driver-API and HIP twins).
* ``blocking_copy``: a memcpy API that returns only when the copy is done (cudaMemcpy, hipMemcpy,
  hipMemcpyWithStream, cuMemcpyDtoH, ...): it waits for all earlier work on its stream first.
* ``pageable_copy``: cudaMemcpyAsync / hipMemcpyAsync whose GPU side is a DtoH copy into pageable
  memory. It looks asynchronous but the host waits for it (the trap behind vLLM #53491).

Left out: torch.profiler's own synchronize when it stops (``torch.autograd.profiler.profile.__exit__``
synchronizes the device before it disables the profiler): a device-wide synchronize at top level (no
enclosing op, no Python frame), the last runtime call of its thread. Every capture ends with one,
and it can last long (158 ms in a shared trace, waiting for the GPU work queued before the stop);
reported as user code it sent readers to a line they never wrote. ``profiler_stop_syncs`` finds it.

Each finding carries the op it ran inside (the innermost enclosing cpu_op / user_annotation /
python_function on the same thread, found by time nesting), the ProfilerStep it fell in, whether a
DtoH copy came just before it on its thread (the ``.item()`` / ``.cpu()`` / ``.tolist()`` pattern),
and the GPU idle time that followed: from when the call began, or when the GPU went idle if later,
to the next kernel start. This module needs only a ProcessView and the GPU busy union, so the
hidden-sync detector can reuse it as is.
"""

from __future__ import annotations

import msgspec
from typing import Optional, Sequence

import numpy as np

from ..reader.arrays import distinct, isin
from ..reader.events import Kind, api_base_name, is_pageable_dtoh, memcpy_direction
from .kernels import us
from ..reader.view import ProcessView

SYNC_CALLS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
    }
)
BLOCKING_COPY_CALLS = frozenset(
    {
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpy3D",
        "cudaMemcpyPeer",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol",
        "cuMemcpy",
        "cuMemcpyDtoH",
        "cuMemcpyHtoD",
        "cuMemcpyDtoD",
        "cuMemcpyPeer",
        "hipMemcpy",
        "hipMemcpyWithStream",
        "hipMemcpyDtoH",
        "hipMemcpyHtoD",
        "hipMemcpyDtoD",
    }
)
# Device-wide synchronizes: what torch.profiler calls (torch.cuda.synchronize) when it stops.
DEVICE_SYNC_CALLS = frozenset({"cudaDeviceSynchronize", "cudaThreadSynchronize", "cuCtxSynchronize", "hipDeviceSynchronize"})
# Calls that queue a copy; any of them can be the DtoH half of a copy-then-sync pair.
COPY_CALLS = frozenset({"cudaMemcpyAsync", "cudaMemcpy2DAsync", "cuMemcpyAsync", "cuMemcpyDtoHAsync", "hipMemcpyAsync", "hipMemcpyDtoHAsync"}) | BLOCKING_COPY_CALLS


def call_kind(name: str) -> Optional[str]:
    """``sync`` / ``blocking_copy`` for a runtime or driver call name, else None."""
    base = api_base_name(name)
    if base in SYNC_CALLS:
        return "sync"
    if base in BLOCKING_COPY_CALLS:
        return "blocking_copy"
    return None


class SyncFinding(msgspec.Struct, frozen=True):
    name: str  # the API called
    kind: str  # sync | blocking_copy | pageable_copy
    tid: object
    ts: float
    dur: float  # how long the host was blocked in the call
    site: str  # innermost enclosing cpu_op / user_annotation, "" at top level
    python: str  # innermost enclosing python_function frame, "" without with_stack
    stack: tuple[str, ...]  # enclosing events, outermost first (ProfilerStep ranges left out)
    step: Optional[int]
    after_dtoh_copy: bool
    gpu_idle_after: float


def find_syncs(view: ProcessView) -> list[SyncFinding]:
    """Every synchronising call of one process, in time order, with ``gpu_idle_after`` 0: the idle time
    a sync caused is the gaps' to attribute (``gaps.attribute_idle``), so that both say the same. Only
    sync and copy calls are walked in Python; the other runtime calls (launches, mostly) are filtered
    out by name id first."""
    names = view.data.names
    copy_names = _copy_names(view)
    per_name: dict[int, tuple[Optional[str], bool]] = {}  # name id -> (call kind, is a copy call)
    findings: list[SyncFinding] = []
    for tid, thread in view.threads.items():
        calls = view.runtime_calls(tid)
        ids = thread.name[calls]
        for nid in distinct(ids).tolist():
            if nid not in per_name:
                per_name[nid] = (call_kind(names[nid]), api_base_name(names[nid]) in COPY_CALLS)
        wanted = [nid for nid, (kind, is_copy) in per_name.items() if kind is not None or is_copy]
        last_call = int(calls[-1]) if len(calls) else -1  # the thread's last runtime call
        calls = calls[isin(ids, wanted)]
        last_copy_was_dtoh = False
        for i, nid, start, dur, corr in zip(calls.tolist(), thread.name[calls].tolist(), thread.ts[calls].tolist(), thread.dur[calls].tolist(), thread.corr[calls].tolist()):
            kind, is_copy = per_name[nid]
            # (is a DtoH copy, is a pageable DtoH copy) of the GPU copy this call made, if any
            dtoh, pageable = copy_names.get(corr, _NOT_A_COPY) if is_copy else _NOT_A_COPY
            if kind is None and pageable:
                kind = "pageable_copy"
            if kind is None:
                if is_copy:
                    last_copy_was_dtoh = dtoh
                continue
            site, python, stack = view.enclosing(tid, i)
            if i == last_call and _is_profiler_stop(names[nid], site, python):
                continue  # torch.profiler's own synchronize at stop (module docstring)
            findings.append(
                SyncFinding(
                    name=names[nid],
                    kind=kind,
                    tid=tid,
                    ts=start,
                    dur=dur,
                    site=site,
                    python=python,
                    stack=stack,
                    step=view.step_at(start),
                    after_dtoh_copy=kind == "sync" and last_copy_was_dtoh,
                    gpu_idle_after=0.0,
                )
            )
            # A pageable DtoH copy is itself the DtoH half of a copy-then-sync pair.
            last_copy_was_dtoh = kind == "pageable_copy"
    findings.sort(key=lambda f: f.ts)
    return findings


def _is_profiler_stop(name: str, site: str, python: str) -> bool:
    return not site and not python and api_base_name(name) in DEVICE_SYNC_CALLS


def profiler_stop_syncs(view: ProcessView) -> list[tuple[object, float, float]]:
    """torch.profiler's own synchronize at stop, per thread that has one: (tid, ts, dur). What
    ``find_syncs`` leaves out, for the summary to say how long the stop waited for the GPU."""
    names = view.data.names
    out = []
    for tid, thread in view.threads.items():
        calls = view.runtime_calls(tid)
        if not len(calls):
            continue
        last = int(calls[-1])
        site, python, _ = view.enclosing(tid, last)
        if _is_profiler_stop(names[thread.name[last]], site, python):
            out.append((tid, float(thread.ts[last]), float(thread.dur[last])))
    return out


def summarize(findings: Sequence[SyncFinding], top_sites: int = 5) -> list[dict]:
    """The ``syncs`` list of the summary: one entry per API name, busiest first, each with its
    call sites."""
    by_name: dict[str, list[SyncFinding]] = {}
    for f in findings:
        by_name.setdefault(f.name, []).append(f)
    out = []
    for name, group in by_name.items():
        sites: dict[tuple, list[SyncFinding]] = {}
        for f in group:
            sites.setdefault((f.site, f.python, f.stack), []).append(f)
        ranked = sorted(sites.items(), key=lambda item: -sum(f.dur for f in item[1]))
        out.append(
            {
                "name": name,
                "kind": group[0].kind,
                "count": len(group),
                "total_us": us(sum(f.dur for f in group)),
                "max_us": us(max(f.dur for f in group)),
                "gpu_idle_after_us": us(sum(f.gpu_idle_after for f in group)),
                "after_dtoh_copy": sum(1 for f in group if f.after_dtoh_copy),
                "sites": [
                    {
                        "site": site,
                        "python": python,
                        "stack": list(stack),
                        "count": len(members),
                        "total_us": us(sum(f.dur for f in members)),
                        "gpu_idle_after_us": us(sum(f.gpu_idle_after for f in members)),
                        "steps": sorted({f.step for f in members if f.step is not None}),
                    }
                    for (site, python, stack), members in ranked[:top_sites]
                ],
            }
        )
    out.sort(key=lambda entry: (-entry["total_us"], entry["name"]))
    return out


_NOT_A_COPY = (False, False)


def _copy_names(view: ProcessView) -> dict[int, tuple[bool, bool]]:
    """correlation → (DtoH, pageable DtoH) of the GPU memcpy it made, for telling a DtoH
    (pageable) copy from the others. Names are classified once each, not once per copy."""
    names = view.data.names
    kind, corr, name = view.columns("kind", "corr", "name")
    pick = (kind == Kind.MEMCPY) & (corr != -1)
    flags: dict[int, tuple[bool, bool]] = {}
    for nid in distinct(name[pick]).tolist():
        flags[nid] = (memcpy_direction(names[nid]) == "DtoH", is_pageable_dtoh(names[nid]))
    return {c: flags[n] for c, n in zip(corr[pick].tolist(), name[pick].tolist())}

