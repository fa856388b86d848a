"""Turn the per-process traces of one capture into what users download, off every engine process.

Probes write plain Kineto JSON (the fastest thing torch can do while it holds the GIL); here, in the
sidecar, ``finalize_capture`` takes a finished capture's raw files through its steps, each in a
module of its own:

- raw_files.py: which reported files are this capture's; each process's sampled stacks read from
  its samples file; the raw files removed at the end, whatever happened.
- raw_trace.py: the first pass over each raw trace (the JSON checked, the merged header's members
  kept) and the process's clock, corrected where it is measurably off the sidecar's.
- compression.py: each raw trace compressed into a file of its own, its sampled stacks'
  flame-chart slices inserted first.
- merged_trace.py: every process in one gzip Chrome/Kineto trace on one timeline.
- merged_analysis.py: the summary of the merged trace, one process at a time.

This module decides what each process's outcome is (the size limit, a file missing, unreadable or
cut short by a full disk: the process's error, never the capture's end), builds each process's
``stack_summary`` (sidecar/stacks/sampled.py) and saves the capture's summary. A samples
file that is missing or unreadable loses the stacks, never the trace: the process's summary says
why. Analysis is a bonus on top of the trace: its failure is reported in the headline only.

Memory grows neither with the trace (each raw file is streamed twice, never loaded whole) nor with
the number of processes (the merged trace is analysed one process at a time).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable

from ...stacks import samples_file as stack_samples
from ...stacks import capture_section as python_stacks, sampled as sampled_stacks
from ...analysis.reader.errors import TraceFormatError
from ...common.protocol import P_DONE
from . import disk_space
from .merged_analysis import analyse_by_process
from .merged_trace import DEVICE_PID_BASE, FLOW_ID_STRIDE, SHARED_PID_BASE, write_merged
from .raw_files import RAW_DIR, load_samples, raw_samples_path, raw_trace_path, remove_raw, unreadable
from .raw_trace import RawTrace, check_trace
from .compression import PROCESS_TRACE_SUFFIX, compress_with_stacks

log = logging.getLogger(__name__)

# What callers import from here: the export's entry point, its outcome, the names of what it
# writes, and the steps that sidecar/service/jobs/captures.py, the tests and the benchmarks use on their own.
__all__ = [
    "DEVICE_PID_BASE", "FLOW_ID_STRIDE", "MERGED_NAME", "PROCESS_TRACE_SUFFIX", "RAW_DIR", "SHARED_PID_BASE",
    "SUMMARY_NAME", "FinalizeResult", "ProcessOutcome", "RawTrace", "analyse_by_process", "check_trace",
    "compress_with_stacks", "finalize_capture", "load_samples", "lower_priority", "raw_samples_path",
    "raw_trace_path", "remove_raw", "write_merged",
]

MERGED_NAME = "trace.json.gz"
SUMMARY_NAME = "summary.json"


@dataclass
class ProcessOutcome:
    file: str | None = None
    bytes: int = 0
    error: str | None = None
    stack_summary: dict[str, Any] | None = None  # from its samples file (sampled stacks)


@dataclass
class FinalizeResult:
    trace_file: str | None = None
    trace_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    processes: dict[str, ProcessOutcome] = field(default_factory=dict)
    summary_file: str | None = None
    headline: str | None = None


def lower_priority() -> None:
    """Executor thread initializer: compression and merging yield the CPU to the engine."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def finalize_capture(capture_dir: Path, records: Iterable[Any], max_bytes: int) -> FinalizeResult:
    """Compress, merge and analyse the raw traces of the finished processes in ``records``, with
    their sampled stacks (``stacks_file``, when a record has one); then delete them and the folders
    they leave empty."""
    records = list(records)
    result = FinalizeResult()
    taken: list[Path] = []  # this capture's raw files: deleted at the end, whatever happens
    kept = []
    total = 0
    # Ranked processes (the GPU workers) first: if the size limit bites, the GPU-side story is what
    # matters most.
    for rec in sorted(records, key=lambda r: (r.rank is None, r.sort_key)):
        if rec.state != P_DONE or not rec.raw_file:
            continue
        samples_file = getattr(rec, "stacks_file", None)
        samples_path = raw_samples_path(capture_dir, samples_file) if samples_file else None
        if samples_path is not None:
            taken.append(samples_path)
        raw = raw_trace_path(capture_dir, rec.raw_file)
        if raw is None:
            result.processes[rec.stem] = ProcessOutcome(error="trace file missing or outside the capture's raw folder")
            continue
        taken.append(raw)
        size = raw.stat().st_size
        if size == 0:  # a probe's export that wrote nothing: say so, not "Expecting value"
            result.processes[rec.stem] = ProcessOutcome(error=unreadable("empty trace file (0 bytes)", raw))
            continue
        stacks, stacks_error = load_samples(capture_dir, samples_file)
        size += stacks.raw.estimated_bytes if stacks is not None else 0  # the slices it adds
        if total + size > max_bytes:
            result.processes[rec.stem] = ProcessOutcome(error=f"dropped: capture size limit of {max_bytes // 2**20} MiB reached")
            result.problems.append(f"size limit of {max_bytes // 2**20} MiB reached")
            continue
        total += size
        kept.append((rec, raw, stacks, stacks_error))

    kept.sort(key=lambda item: item[0].sort_key)
    traces: list[RawTrace] = []
    try:
        for rec, raw, stacks, stacks_error in kept:
            try:
                trace = check_trace(rec, raw)
            except TraceFormatError as exc:
                result.processes[rec.stem] = ProcessOutcome(error=unreadable(exc.problem, raw))
                continue
            except (OSError, ValueError) as exc:
                result.processes[rec.stem] = ProcessOutcome(error=unreadable(disk_space.describe(exc), raw))
                continue
            gz_name = rec.stem + PROCESS_TRACE_SUFFIX
            trace.stacks = stacks
            try:
                stacks_error = compress_with_stacks(trace, capture_dir / gz_name) or stacks_error
            except OSError as exc:
                result.processes[rec.stem] = ProcessOutcome(error=f"compression failed: {disk_space.describe(exc)}")
                continue
            result.processes[rec.stem] = ProcessOutcome(file=gz_name, bytes=(capture_dir / gz_name).stat().st_size,
                                                        stack_summary=_stack_summary(stacks, stacks_error))
            traces.append(trace)
        if traces:
            merged = capture_dir / MERGED_NAME
            try:
                write_merged(merged, traces)
                result.trace_file, result.trace_bytes = MERGED_NAME, merged.stat().st_size
            except OSError as exc:
                result.problems.append(f"merge failed: {disk_space.describe(exc)}")
    finally:
        remove_raw(capture_dir, taken)
    if result.trace_file:
        summaries = {stem: o.stack_summary for stem, o in result.processes.items() if o.stack_summary is not None}
        result.summary_file, result.headline = _analyse(capture_dir, capture_dir / MERGED_NAME, records, summaries)
    return result


def _stack_summary(stacks: stack_samples.Samples | None, error: str | None) -> dict[str, Any] | None:
    """A process's ``stack_summary``: its samples' summary, or what happened to them."""
    summary: dict[str, Any] | None = None
    if stacks is not None:
        try:
            summary = sampled_stacks.summary(stacks)
        except Exception as exc:  # a bug here must not cost the capture
            log.exception("summary of sampled stacks failed")
            error = f"python stacks summary failed: {exc}"
    if error is None:
        return summary
    return {**(summary or {"samples": 0}), "error": error[:500]}


def _analyse(capture_dir: Path, merged: Path, records: Iterable[Any] = (),
             stack_summaries: dict[str, dict] | None = None) -> tuple[str | None, str | None]:
    """Analysis is a bonus on top of the trace: its failure is reported in the headline only. The
    sampled Python stacks go into the summary's ``python_stacks`` and the headline: each process's
    ``stack_summary``, or the one built here from its samples (``stack_summaries``, by stem)."""
    try:
        from ...analysis import summary as _analysis_available  # noqa: F401
    except ImportError:
        return None, None
    try:
        summary = analyse_by_process(merged)
    except Exception as exc:  # analysis is a bonus: the trace is still there
        log.warning("analysis of %s failed: %s", merged, exc)
        return None, f"analysis failed: {exc}"
    built = stack_summaries or {}
    stacks = python_stacks.section(
        SimpleNamespace(label=r.label, stacks=getattr(r, "stacks", "none"),
                        stack_summary=built.get(r.stem, getattr(r, "stack_summary", None))) for r in records)
    if stacks:
        summary["python_stacks"] = stacks
        extra = python_stacks.headline(stacks)
        if extra:
            summary["headline"] = "; ".join(filter(None, (summary.get("headline"), extra)))
    try:
        disk_space.write_atomic(capture_dir / SUMMARY_NAME, json.dumps(summary, indent=1))
    except OSError as exc:  # the trace is still there; the headline says why there is no summary
        log.warning("summary of %s not saved: %s", merged, exc)
        return None, f"summary not saved: {disk_space.describe(exc)}"
    return SUMMARY_NAME, summary.get("headline")
