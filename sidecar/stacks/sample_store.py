"""What a ``StackSampler`` keeps while it samples, and how it hands that over: the ``SampleStore``.

The sampler (sidecar/stacks/sampler.py) is a thread and its loop; this is what the loop fills:

* the frames and stacks, each interned once: a code object becomes a frame index the first time it
  is seen (its qualname, file, first line; a file under ``skip_files`` becomes -1, left out), a tuple
  of frame indices a stack index. The code objects stay referenced so that their ``id()``, the
  cache key, cannot be reused while the cache holds it;
* what a change of stack adds to the flame chart the sidecar will build from the samples (slices
  kept from the root, new slices, their estimated JSON bytes), one table entry per pair of stacks
  met, so that the sampler checks its ``max_events`` and ``max_bytes`` bounds with a dict lookup per
  change of stack;
* the per-sample columns (``array`` buffers: time, stack index, line, GIL wait), the sampling
  segments with the (monotonic, Unix) clock pairs measured at their start and end, and the counters
  the samples file reports.

The sampling loop binds these tables and columns to locals and fills them in place: a method call
per sample would cost the engine's step thread time under the GIL (benchmarks/bench_sampler.py).
``raw`` packs them into the raw samples file's one object (sidecar/stacks/samples_file.py): a copy of each
buffer, no loop over the samples.

The clock
---------
Samples are stamped with a monotonic clock (``time.perf_counter_ns``, CLOCK_MONOTONIC: immune to
wall-clock steps during a capture). A (monotonic, Unix) pair is measured at the start and at the end
of every sampling segment (the tightest of a few back-to-back readings), so that the sidecar can map
sample times onto the Unix time of torch.profiler's Kineto trace (sidecar/stacks/sampled.py
says how that clock was verified).
"""

from __future__ import annotations

from array import array
from itertools import accumulate, chain
from typing import Any, Callable, Optional

from .samples_file import RawSamples, Segment, frame_name

_EVENT_OVERHEAD_BYTES = 150  # a slice's JSON beyond its name and file (measured: 135-145)


class LiveSegment:
    """One start..stop stretch of sampling while it is recorded: samples [lo, hi), its clock pairs."""

    __slots__ = ("lo", "hi", "start_ns", "end_ns", "cal0", "cal1")

    def __init__(self, lo: int, cal0: tuple[int, int]) -> None:
        self.lo = self.hi = lo
        self.start_ns: Optional[int] = None  # monotonic: when start() was called
        self.end_ns: int = 0  # monotonic: when the last run ends (stop time, capped)
        self.cal0 = cal0  # (monotonic ns, unix ns) at the start
        self.cal1 = cal0  # ... and at the end


def calibrate(clock: Callable[[], int], wall: Callable[[], int], tries: int = 5) -> tuple[int, int]:
    """(monotonic, unix) ns at one instant: the tightest of a few back-to-back wall readings."""
    best = None
    for _ in range(tries):
        w0 = wall()
        m = clock()
        w1 = wall()
        if best is None or w1 - w0 < best[0]:
            best = (w1 - w0, m, (w0 + w1) // 2)
    return best[1], best[2]  # type: ignore[index]


class SampleStore:
    """The interned frames and stacks, the sample columns, the segments and the counters of one
    sampler (module docstring). Written by the sampling thread only; ``raw`` reads it from another
    thread once the sampler is parked (or copies what it has so far)."""

    def __init__(self, skip_files: tuple[str, ...], max_depth: int) -> None:
        self.skip_files = skip_files
        # Frames: index -> (qualname, file, first line).
        self.frames: list[tuple[str, str, int]] = []
        self.frame_bytes: list[int] = []
        self.code_ids: dict[int, int] = {}  # id(code) -> frame index, -1 for a skipped frame
        self._code_refs: list[Any] = []
        self.cut_frame = self._add_frame(f"[stack cut at {max_depth} frames]", "", 0)
        # Samples: monotonic time, stack index, executing line of the innermost kept frame.
        self.t = array("q")
        self.s = array("i")
        self.line = array("i")
        self.wait = array("q")  # ns from the tick the sample was due at to the sample (GIL wait)
        self.stacks: list[tuple[int, ...]] = []  # index -> frame indices, innermost first
        self.stack_ids: dict[tuple[int, ...], int] = {}
        # (previous stack, stack) -> (levels kept from the root, new slices, their estimated bytes)
        self.transitions: dict[tuple[int, int], tuple[int, int, int]] = {}
        self.segments: list[LiveSegment] = []
        self.slices = 0
        self.bytes = 0
        self.missed = 0
        self.truncated = 0
        self.cpu_ns = 0
        self.active_ns = 0

    def __len__(self) -> int:
        return len(self.t)

    def _add_frame(self, qualname: str, filename: str, firstline: int) -> int:
        fid = len(self.frames)
        self.frames.append((qualname, filename, firstline))
        self.frame_bytes.append(len(frame_name(qualname, filename, firstline)) + len(filename)
                                + _EVENT_OVERHEAD_BYTES)
        return fid

    def intern(self, code: Any) -> int:
        """The frame index of a code object seen for the first time (-1: its file is skipped)."""
        filename = code.co_filename
        if filename.startswith(self.skip_files):
            fid = -1
        else:
            fid = self._add_frame(getattr(code, "co_qualname", code.co_name), filename, code.co_firstlineno)
        self.code_ids[id(code)] = fid
        self._code_refs.append(code)
        return fid

    def transition(self, prev: int, sid: int) -> tuple[int, int, int]:
        """What going from stack ``prev`` to ``sid`` adds to the flame chart (for the bounds)."""
        new = self.stacks[sid]
        old = self.stacks[prev] if prev >= 0 else ()
        keep = 0
        limit = min(len(new), len(old))
        while keep < limit and new[-1 - keep] == old[-1 - keep]:
            keep += 1
        fresh = len(new) - keep
        nbytes = sum(self.frame_bytes[f] for f in new[: fresh])
        step = self.transitions[(prev, sid)] = (keep, fresh, nbytes)
        return step

    def open_segment(self, start_ns: Optional[int], clock: Callable[[], int], wall: Callable[[], int]) -> LiveSegment:
        """A new segment from the next sample on, its start clock pair measured now."""
        seg = LiveSegment(len(self.t), calibrate(clock, wall))
        seg.start_ns = start_ns
        self.segments.append(seg)
        return seg

    def close_segment(self, seg: LiveSegment, end_ns: int, clock: Callable[[], int], wall: Callable[[], int]) -> None:
        """``seg`` ends at ``end_ns`` with the samples taken so far; its end clock pair measured now."""
        seg.hi = len(self.t)
        seg.end_ns = end_ns
        seg.cal1 = calibrate(clock, wall)

    def drop_after(self, seg: LiveSegment, t: int) -> None:
        """Remove ``seg``'s samples taken after ``t`` (after ``stop()``: not wanted)."""
        while len(self.t) > seg.lo and self.t[-1] > t:
            self.t.pop()
            self.s.pop()
            self.line.pop()
            self.wait.pop()

    def recover(self) -> None:
        """After an error inside a segment: equal-length sample columns, the last segment closed."""
        n = min(len(self.t), len(self.s), len(self.line), len(self.wait))
        for column in (self.t, self.s, self.line, self.wait):
            del column[n:]
        if self.segments:
            seg = self.segments[-1]
            if seg.hi <= seg.lo:
                seg.hi = n
                seg.end_ns = self.t[n - 1] if n > seg.lo else seg.end_ns

    def raw(self, **sampler: Any) -> RawSamples:
        """The samples so far as the raw samples file holds them, with ``sampler``'s own fields (pid,
        thread ids, rate, switch interval, stop reason, error). Copies the columns' buffers; no loop
        over the samples."""
        columns = (self.t, self.s, self.line, self.wait)
        n = min(map(len, columns))  # equal unless the thread is still appending
        times, sids, lines, waits = (column[:n].tobytes() for column in columns)
        segments = []
        for seg in list(self.segments):
            lo, hi, end_ns = min(seg.lo, n), min(seg.hi, n), seg.end_ns
            if hi <= lo and seg is self.segments[-1] and n > lo:  # still open: its samples so far
                hi, end_ns = n, self.t[n - 1]
            segments.append(Segment(lo, hi, seg.start_ns, end_ns, seg.cal0, seg.cal1))
        stacks = list(self.stacks)
        return RawSamples(
            **sampler, frames=list(self.frames), cut_frame=self.cut_frame,
            stack_frames=array("i", chain.from_iterable(stacks)).tobytes(),
            stack_ends=array("i", accumulate(map(len, stacks))).tobytes(),
            times=times, stack_ids=sids, lines=lines, waits=waits, segments=segments,
            missed=self.missed, truncated=self.truncated, cpu_ns=self.cpu_ns, active_ns=self.active_ns,
            events=self.slices, estimated_bytes=self.bytes)
