"""Sync sites from a Kineto trace (a capture, or a user's own file), in the detector's report model.

The finding itself is ``sidecar.analysis.questions.syncs``' work (synchronize calls, blocking memcpys,
"non-blocking" DtoH copies into pageable memory, each with the GPU idle time that followed; only
that part of the analysis runs); this module only names each one the way a live scan does, with
an engine profile's phase rules, allowlist entries and skipped packages (``sidecar.engine``), and
merges the processes' sites with the live reports' routine (``report.merge_sites``):

* ``op``: from the outermost aten op around the call that says what the code wrote (``aten::item``
  → item, ``aten::is_nonzero`` → bool, ``aten::to`` / ``copy_`` → copy_to_host, ...), else from the
  runtime call (cudaEventSynchronize → event.synchronize, cudaStreamSynchronize →
  stream.synchronize, cudaDeviceSynchronize → synchronize, a blocking memcpy → copy_to_host).
* the site: the innermost Python frame outside torch, this project and the profile's
  ``skip_packages`` when the trace has stacks (``with_stack``); otherwise ``function`` is the
  innermost enclosing annotation or module that is not an aten op
  (``DistributedDataParallel.forward``), and ``file`` / ``path`` are empty.

Sites count runtime calls: on a GPU one ``.item()`` is a DtoH memcpy into pageable memory plus a
stream synchronize, so it shows as two sites with the same op and different ``api``. Extra fields
beside the live report's: ``api``, ``kind`` (sync / blocking_copy / pageable_copy),
``gpu_idle_after_us``, ``cpu_op``.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, Optional, Sequence

from .. import engine
from .reader.processes import split_processes
from .summary import load, trace_files
from .questions.gaps import find_process_syncs
from ..syncs.allowlist import Allowlist
from ..syncs.report import merge_sites, sort_sites
from ..syncs.sites import OTHER, PhaseRule

_PY_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<function>.+)$")
_SITE_PACKAGES = re.compile(r".*/(?:site|dist)-packages/")
# Import-relative path prefixes whose frames are never a site: torch's and this project's. An engine
# integration adds its own package through its profile's ``skip_packages`` (``skip_prefixes``).
DEFAULT_SKIP = ("torch/", "sidecar/")

# aten op in a trace → report op. The outermost one found wins: it is what the code called.
ATEN_OPS = {
    "aten::is_nonzero": "bool",
    "aten::item": "item",
    "aten::_local_scalar_dense": "item",
    "aten::equal": "equal",
    "aten::allclose": "allclose",
    "aten::nonzero": "nonzero",
    "aten::argwhere": "nonzero",
    "aten::masked_select": "masked_select",
    "aten::unique": "unique",
    "aten::_unique2": "unique",
    "aten::unique_dim": "unique",
    "aten::unique_consecutive": "unique_consecutive",
    "aten::bincount": "bincount",
    "aten::repeat_interleave": "repeat_interleave",
    "aten::index": "boolean_mask_index",
    "aten::index_put_": "boolean_mask_index",
    "aten::to": "copy_to_host",
    "aten::cpu": "copy_to_host",
    "aten::_to_copy": "copy_to_host",
    "aten::copy_": "copy_to_host",
}
_COPY_OPS = frozenset({"aten::to", "aten::cpu", "aten::_to_copy", "aten::copy_"})


def trace_op(api: str, kind: str, stack: Sequence[str]) -> tuple[str, str]:
    """(report op, innermost aten op) for one finding."""
    aten = next((name for name in stack if name in ATEN_OPS), "")  # stack is outermost first
    innermost = next((name for name in reversed(stack) if name.startswith("aten::")), "")
    if aten:
        if kind == "pageable_copy" and aten in _COPY_OPS:
            return "copy_to_pageable_non_blocking", innermost
        return ATEN_OPS[aten], innermost
    if kind == "pageable_copy":
        return "copy_to_pageable_non_blocking", innermost
    if kind == "blocking_copy":
        return "copy_to_host", innermost
    if "Event" in api:
        return "event.synchronize", innermost
    if "Stream" in api:
        return "stream.synchronize", innermost
    return "synchronize", innermost


def trace_site(stack: Sequence[str], skip: Sequence[str] = DEFAULT_SKIP) -> dict[str, Any]:
    """file / path / line / function for one finding's enclosing stack (outermost first)."""
    for name in reversed(stack):
        m = _PY_FRAME.match(name)
        if m is None:
            continue
        file = m.group("file")
        path = _SITE_PACKAGES.sub("", file.replace(os.sep, "/"))
        if path.startswith(tuple(skip)) or "/torch/" in file:
            continue
        return {"file": file, "path": path, "line": int(m.group("line")), "function": m.group("function")}
    context = next((n for n in reversed(stack) if not n.startswith("aten::") and not _PY_FRAME.match(n)), "")
    return {"file": "", "path": "", "line": 0, "function": context}


def skip_prefixes(profile: engine.EngineProfile) -> tuple[str, ...]:
    """``DEFAULT_SKIP`` plus the import-relative folders of the profile's ``skip_packages``."""
    return DEFAULT_SKIP + tuple(p.replace(".", "/") + "/" for p in profile.skip_packages)


def _phase(stack: Sequence[str], rules: Iterable[PhaseRule]) -> str:
    rules = tuple(rules)
    for name in reversed(stack):
        m = _PY_FRAME.match(name)
        if m is not None:
            for rule in rules:
                if rule.matches_location(m.group("file"), m.group("function")):
                    return rule.phase
    return OTHER


def scan_trace(
    path: str | os.PathLike,
    allowlist: Optional[Allowlist] = None,
    profile: Optional[engine.EngineProfile] = None,
) -> dict[str, Any]:
    """Every sync site of a trace file, or of a folder of rank files, one report per process
    (``processes``) and all of them merged (``sites``). ``profile`` gives the phase rules, the
    allowlist entries (unless ``allowlist`` is given) and the packages whose frames are skipped; by
    default, those of every installed engine profile (``sidecar.engine.installed_profiles``), since
    a trace file does not say which engine wrote it. Raises ``TraceFormatError`` for anything
    unreadable."""
    profile = profile if profile is not None else engine.combined(engine.installed_profiles())
    allowlist = allowlist if allowlist is not None else Allowlist(profile.allow_entries)
    skip = skip_prefixes(profile)
    processes = []
    for file in trace_files(path):
        data = load(file)
        for view in split_processes(data):
            findings = find_process_syncs(view)
            steps = len({f.step for f in findings if f.step is not None}) or len(view.steps)
            processes.append({"process": view.label, "file": str(file), "steps": steps,
                              "sites": _sites(findings, steps, allowlist, profile.phase_rules, skip)})
        del data
    return {"type": "sync", "source": "trace", "path": str(path), "processes": processes,
            "sites": sort_sites(merge_sites(processes, lambda proc: proc["process"]))}


def _sites(findings, steps: int, allowlist: Allowlist, phase_rules: Sequence[PhaseRule],
           skip: Sequence[str]) -> list[dict[str, Any]]:
    grouped: dict[tuple, dict[str, Any]] = {}
    for f in findings:
        op, cpu_op = trace_op(f.name, f.kind, f.stack)
        where = trace_site(f.stack, skip)
        key = (where["path"], where["line"], where["function"], op, f.name)
        site = grouped.get(key)
        if site is None:
            site = grouped[key] = {
                **where, "op": op, "api": f.name, "kind": f.kind, "cpu_op": cpu_op,
                "phase": _phase(f.stack, phase_rules), "count": 0, "blocked_us": 0.0, "gpu_idle_after_us": 0.0,
                "first_step": f.step if f.step is not None else -1, "last_step": f.step if f.step is not None else -1,
            }
        site["count"] += 1
        site["blocked_us"] += f.dur
        site["gpu_idle_after_us"] += f.gpu_idle_after
        if f.step is not None:
            site["first_step"] = f.step if site["first_step"] < 0 else min(site["first_step"], f.step)
            site["last_step"] = max(site["last_step"], f.step)
    out = []
    for site in grouped.values():
        site["blocked_us"] = round(site["blocked_us"], 1)
        site["gpu_idle_after_us"] = round(site["gpu_idle_after_us"], 1)
        site["count_per_step"] = round(site["count"] / steps, 3) if steps else float(site["count"])
        site["classification"], site["reason"] = allowlist.classify(site)
        out.append(site)
    return sort_sites(out)
