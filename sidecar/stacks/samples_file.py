"""The raw samples file: what a probe's stack sampler hands to the sidecar, as it sampled it.

A probe that sampled Python stacks (sidecar/stacks/sampler.py) writes its samples, unprocessed,
beside its exported Kineto trace: ``<trace stem>.stacks.msgpack`` in the same ``raw/`` folder
(``samples_path``), and reports that path (``CaptureReport.stacks_file``). Everything that turns
samples into something a person reads — the flame-chart slices added to the process's trace, the
summary of the hottest lines — runs in the sidecar, on its low-priority export thread
(sidecar/stacks/sampled.py): inside the engine process the export thread holds the GIL
while it works, and every millisecond of it competes with the engine's step thread.

So the file is cheap to write: one msgpack map (``RawSamples``, encoded by msgspec in C), whose
per-sample columns are the sampler's own ``array`` buffers as bytes (``array.tobytes``), in the
writer's byte order (named in the file). Nothing in the probe loops over the samples.

Its contents
------------
* ``frames``: ``[qualname, file, first line]`` per distinct code object seen, in the order met;
  ``cut_frame`` is the index of the synthetic root ``[stack cut at N frames]`` (file "").
* stacks: ``stack_frames`` (int32 frame indices, innermost first, every stack one after the other)
  and ``stack_ends`` (int32, where each stack ends in it): stack ``k`` is
  ``stack_frames[stack_ends[k-1]:stack_ends[k]]``.
* per sample: ``times`` (int64 monotonic ns), ``stack_ids`` (int32), ``lines`` (int32: the executing
  line of the innermost kept frame) and ``waits`` (int64 ns from the tick the sample was due at to
  the sample: the GIL wait, which weights.py reads).
* ``segments``: per start..stop stretch ``[lo, hi, start_ns, end_ns, cal0, cal1]``: samples
  ``[lo, hi)``, the monotonic time ``start()`` was called (or null) and the time the last run
  ends, and the (monotonic ns, Unix ns) calibration pairs measured at its start and end, which map
  the monotonic times onto the trace's clock (``Segment.to_unix``).
* the sampler: ``pid``, ``thread_id`` (the target's ``threading.get_ident()``), ``native_id`` (its
  OS thread id), ``hz``, ``period_ns``, the writer's ``switch_interval_s``, ``stop_reason`` and
  ``error``, and its counters (``missed`` ticks, ``truncated`` stacks, its own ``cpu_ns``,
  ``active_ns``, the slices it counted, ``events``, and their ``estimated_bytes``).

``decode`` checks everything a reader relies on (lengths, indices in range, segments in order) and
raises ``SamplesFormatError`` naming the problem: a corrupt file loses the stacks, never the trace.
"""

from __future__ import annotations

import os
import sys
from array import array
from dataclasses import dataclass
from typing import Optional

import msgspec

FORMAT = 1
SUFFIX = ".stacks.msgpack"
_INT32, _INT64 = "i", "q"


class SamplesFormatError(ValueError):
    """A samples file that is not one this version writes."""


def samples_path(trace_path: str) -> str:
    """The samples file beside the raw trace ``<folder>/<stem>.json``: ``<folder>/<stem>.stacks.msgpack``."""
    root, _ext = os.path.splitext(trace_path)
    return root + SUFFIX


def frame_name(qualname: str, filename: str, firstline: int) -> str:
    """A frame's slice name: ``qualname (file.py:first line)``; the bare name for a synthetic frame."""
    return f"{qualname} ({os.path.basename(filename)}:{firstline})" if filename else qualname


class Segment(msgspec.Struct, array_like=True, frozen=True):
    lo: int
    hi: int
    start_ns: Optional[int]  # monotonic: when start() was called
    end_ns: int  # monotonic: when the last run ends (stop time, capped)
    cal0: tuple[int, int]  # (monotonic ns, unix ns) at the start
    cal1: tuple[int, int]  # ... and at the end

    def to_unix(self, t: int) -> int:
        """A monotonic time as Unix ns, interpolating linearly between the two calibration pairs."""
        (m0, w0), (m1, w1) = self.cal0, self.cal1
        if m1 <= m0:
            return w0 + (t - m0)
        return w0 + (t - m0) + ((t - m0) * ((w1 - w0) - (m1 - m0))) // (m1 - m0)


class RawSamples(msgspec.Struct, kw_only=True, frozen=True):
    """The file's one object (module docstring)."""

    format: int = FORMAT
    byteorder: str = sys.byteorder
    pid: int
    thread_id: Optional[int] = None
    native_id: Optional[int] = None
    hz: float
    period_ns: int
    switch_interval_s: float
    frames: list[tuple[str, str, int]]
    cut_frame: int
    stack_frames: bytes
    stack_ends: bytes
    times: bytes
    stack_ids: bytes
    lines: bytes
    waits: bytes
    segments: list[Segment]
    stop_reason: Optional[str] = None
    error: Optional[str] = None
    missed: int = 0
    truncated: int = 0
    cpu_ns: int = 0
    active_ns: int = 0
    events: int = 0
    estimated_bytes: int = 0


@dataclass(frozen=True)
class Samples:
    """A checked ``RawSamples`` with its columns as arrays and its stacks as tuples."""

    raw: RawSamples
    stacks: list[tuple[int, ...]]  # frame indices, innermost first
    times: array
    stack_ids: array
    lines: array
    waits: array

    def __len__(self) -> int:
        return len(self.times)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(RawSamples)


def encode(raw: RawSamples) -> bytes:
    return _encoder.encode(raw)


def decode(data: bytes) -> Samples:
    """The samples of a file's bytes, checked. Raises ``SamplesFormatError``."""
    try:
        raw = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SamplesFormatError(f"not a samples file: {exc}") from None
    return check(raw)


def read(path: str | os.PathLike) -> Samples:
    """The samples file at ``path``, checked. Raises OSError, ``SamplesFormatError``."""
    with open(path, "rb") as f:
        return decode(f.read())


def check(raw: RawSamples) -> Samples:
    """``raw`` with its columns decoded and everything a reader indexes checked."""
    if raw.format != FORMAT:
        raise SamplesFormatError(f"samples file format {raw.format}, this version reads {FORMAT}")
    if raw.byteorder not in ("little", "big"):
        raise SamplesFormatError(f"unknown byte order {raw.byteorder!r}")
    if raw.period_ns < 1 or not raw.hz > 0 or not raw.switch_interval_s > 0:
        raise SamplesFormatError("period_ns, hz and switch_interval_s must be positive")
    swap = raw.byteorder != sys.byteorder
    times = _column(raw.times, _INT64, swap, "times")
    stack_ids = _column(raw.stack_ids, _INT32, swap, "stack_ids")
    lines = _column(raw.lines, _INT32, swap, "lines")
    waits = _column(raw.waits, _INT64, swap, "waits")
    stack_frames = _column(raw.stack_frames, _INT32, swap, "stack_frames")
    stack_ends = _column(raw.stack_ends, _INT32, swap, "stack_ends")
    n = len(times)
    if not len(stack_ids) == len(lines) == len(waits) == n:
        raise SamplesFormatError(f"sample columns of different lengths: {len(times)}, {len(stack_ids)}, "
                                 f"{len(lines)}, {len(waits)}")
    nframes = len(raw.frames)
    if not 0 <= raw.cut_frame < nframes:
        raise SamplesFormatError(f"cut_frame {raw.cut_frame} outside the {nframes} frames")
    if stack_frames and (min(stack_frames) < 0 or max(stack_frames) >= nframes):
        raise SamplesFormatError("a stack names a frame that is not in the frame table")
    stacks: list[tuple[int, ...]] = []
    lo = 0
    for end in stack_ends:
        if not lo <= end <= len(stack_frames):
            raise SamplesFormatError("stack_ends out of order or past the stack frames")
        stacks.append(tuple(stack_frames[lo:end]))
        lo = end
    if lo != len(stack_frames):
        raise SamplesFormatError("stack frames beyond the last stack")
    if stack_ids and (min(stack_ids) < 0 or max(stack_ids) >= len(stacks)):
        raise SamplesFormatError("a sample names a stack that is not in the stack table")
    hi = 0
    for seg in raw.segments:
        if not hi <= seg.lo <= seg.hi <= n:
            raise SamplesFormatError(f"segment [{seg.lo}, {seg.hi}) out of order or past the {n} samples")
        hi = seg.hi
    if hi != n:
        raise SamplesFormatError(f"samples outside every segment ({n - hi} after the last)")
    return Samples(raw=raw, stacks=stacks, times=times, stack_ids=stack_ids, lines=lines, waits=waits)


def _column(data: bytes, typecode: str, swap: bool, name: str) -> array:
    column = array(typecode)
    if len(data) % column.itemsize:
        raise SamplesFormatError(f"{name}: {len(data)} bytes is not a whole number of items")
    column.frombytes(data)
    if swap:
        column.byteswap()
    return column
