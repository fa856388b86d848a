"""Each process's raw trace compressed into a file of its own, with its sampled stacks.

Probes write uncompressed JSON (gzip in the engine process held the GIL for seconds); the sidecar
compresses each file here, off every engine process, as ``<process>.pt.trace.json.gz`` (the suffix
TensorBoard's profiler plugin looks for). A process that sampled Python stacks has their
flame-chart slices inserted first in its events (``kineto_file.copy_with_events``), streamed: the
raw file is never loaded whole.
"""

from __future__ import annotations

import gzip
import logging
from pathlib import Path
from typing import Iterable

from . import disk_space, kineto_file
from .raw_trace import RawTrace

log = logging.getLogger(__name__)

PROCESS_TRACE_SUFFIX = ".pt.trace.json.gz"  # the suffix TensorBoard's profiler plugin looks for


def compress_with_stacks(trace: RawTrace, target: Path) -> str | None:
    """``compress`` with the trace's sampled stacks. When they cannot go in (anything but an I/O
    error), the trace is compressed without them and dropped from the merge; returns why."""
    try:
        compress(trace.path, target, trace.sampled_events())
        return None
    except OSError:
        raise
    except Exception as exc:
        if trace.stacks is None:
            raise
        log.warning("%s: sampled stacks not added: %s", trace.path, exc)
        trace.stacks = None
        compress(trace.path, target)
        return f"python stacks not added to the trace: {exc}"


def compress(raw: Path, target: Path, events: Iterable[dict] = ()) -> None:
    """gzip ``raw`` into ``target``, with ``events`` first in its ``traceEvents``; on failure no
    partial ``target`` stays (the files are closed first)."""
    try:
        with raw.open("rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
            kineto_file.copy_with_events(src, dst, events, str(raw))
    except BaseException:
        disk_space.unlink_quietly(target)
        raise
