"""One process's raw trace, checked once before it is compressed and merged, and its clock.

A probe writes plain Kineto JSON; before the sidecar uses a file it reads it once with the
analyser's reader (``sidecar.analysis.reader.stream``) without building the events (``msgspec.Raw``):
the whole JSON is checked, and the top-level members the merged header needs are kept (Kineto
writes ``baseTimeNanoseconds`` after ``traceEvents``, so they are only known at the end).

Kineto writes ``ts`` relative to ``baseTimeNanoseconds``, the process's own wall clock. A process
whose clock is measurably off the sidecar's (another host: sidecar/service/channel/clock_sync.py) has its base corrected
here (``aligned_base_ns``), so the merged trace (merged_trace.py) puts every process on one clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import msgspec

from ...stacks import samples_file as stack_samples
from ...stacks import sampled as sampled_stacks
from ...analysis.reader.errors import TraceFormatError
from ...analysis.reader.stream import TopLevel, read_events

# Top-level members of a raw trace that the merged header takes.
# ``inference_sidecar``: what the probe noted in its trace (its phase ranges, sidecar/common/phases.py).
HEADER_MEMBERS = frozenset({"baseTimeNanoseconds", "deviceProperties", "inference_sidecar"})


@dataclass
class RawTrace:
    """One process's raw trace, checked, with the top-level members the merged header needs."""

    rec: Any  # the capture's process record: label, role, pid, rank, step_driven, sort_key
    path: Path
    members: dict[str, Any]
    stacks: stack_samples.Samples | None = None  # its sampled Python stacks, added to its events

    @property
    def base_ns(self) -> int:
        """The file's own base: its process's wall clock."""
        return int(self.members.get("baseTimeNanoseconds") or 0)

    @property
    def aligned_base_ns(self) -> int:
        """The base on the sidecar's clock: less the process's clock offset where that was
        measurably off (another host; sidecar/service/channel/clock_sync.py), else the file's own."""
        return self.base_ns - int(getattr(self.rec, "clock_correction_ns", 0) or 0)

    def sampled_events(self) -> Iterator[dict]:
        """The sampled stacks' events on this file's clock (none without sampled stacks)."""
        return sampled_stacks.iter_events(self.stacks, self.base_ns) if self.stacks is not None else iter(())


def check_trace(rec: Any, path: Path) -> RawTrace:
    """The first pass over a raw trace: the whole JSON is checked and the header's members kept.
    Raises ValueError (``TraceFormatError``) for a file that is not a Kineto trace."""
    top = TopLevel()
    for _batch in read_events(str(path), top, msgspec.Raw, keep=HEADER_MEMBERS):
        pass
    if top.array_format:
        raise TraceFormatError(str(path), "not a Kineto trace (no traceEvents list)")
    return RawTrace(rec, path, top.members)
