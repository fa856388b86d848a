"""Python stacks of one thread by sampling, not tracing: a flame chart on the trace's own clock.

torch.profiler's ``with_stack`` traces every Python call and processes them in ``stop()`` on the
step thread (issue 15: a 13.4 s stall on real vLLM). ``StackSampler`` instead reads ONE target
thread's stack, ``sys._current_frames()[thread_id]``, from a daemon thread of its own at a fixed
rate (default 1000 Hz), only while it is started, and turns runs of identical stacks into nested
Chrome-trace slices added to the process's Kineto JSON trace.

What each thread pays
---------------------
* The target (the engine's step thread): nothing of the sampler runs on it. ``start()`` reads a
  clock, sets a flag under an uncontended lock and sets an Event; ``stop()`` reads a clock and
  sets a flag. Neither waits for the sampler, and neither raises. The sampler never holds a frame
  or the thread object between samples: it keeps code objects (name, file, first line), so it
  never keeps the target or its locals alive.
* The GIL: every sample needs it, so a sample delays the target by its cost (a frame walk of up to
  ``max_depth`` frames with a per-code-object cache; benchmarks/bench_sampler.py measures it).
  While the target runs pure Python it holds the GIL, and the sampler gets it only when the
  interpreter forces a switch, after ``sys.getswitchinterval()`` (5 ms by default): against such
  code the achieved rate is about 150-200 Hz whatever ``hz`` says; against code that releases the
  GIL (torch ops, I/O, waits) it is the requested rate. The summary reports the achieved rate, and
  ranks frames by sampled *time* rather than sample counts, which would under-count Python-heavy
  code by a factor of up to five (``summary``, stack_weights.py). The sampler thread keeps the default
  OS priority on purpose: a low-priority thread that holds the GIL and is preempted would stall
  every other thread (priority inversion).
* Idle: the thread waits on an Event; no polling, no wakeups.
* Bounds: at most ``max_samples`` samples, ``max_events`` output slices and ``max_bytes`` (estimated
  JSON size of the slices), each counted while sampling; the first one reached stops the sampler
  for good, and ``summary()["stop_reason"]`` says which. A stack deeper than ``max_depth`` keeps
  its innermost ``max_depth`` frames (skipped ones included) under a synthetic root frame
  ``[stack cut at N frames]``.

The clock (verified with torch 2.13.0+cpu, Kineto's JSON writer)
----------------------------------------------------------------
A trace written by ``torch.profiler.profile(...).export_chrome_trace(path)`` has a top-level
``baseTimeNanoseconds`` and events whose ``ts``/``dur`` are microseconds (fractional, ns
resolution) *relative to that base*: the absolute time of an event is
``baseTimeNanoseconds + ts * 1000`` ns, and that is Unix time, CLOCK_REALTIME (``time.time_ns()``).
torch stamps events with the TSC and converts them to CLOCK_REALTIME with pairs of readings taken at
the profiler's start and end (``c10::ApproximateClockToUnixTimeConverter``). The base is not the
start of the capture: it was 1790857026000000000 in two different processes minutes apart, with
``ts`` near 4.52e12 µs. Measured (300 ``aten::mul`` calls, each bracketed by clock readings taken in
Python just before and after the call): every op's ``base + ts*1000`` lay inside its bracket of
``time.time_ns()`` readings (start 1.28 µs after the reading before at the least, 2.56 µs median;
end 0.51 µs before the reading after at the least), and also inside its bracket of
``time.perf_counter_ns()`` readings mapped to Unix time as below (same margins, within 0.3 µs).
In that version ``baseTimeNanoseconds`` precedes ``traceEvents``; other versions write it after
(``sidecar/service/merge.py`` reads it from anywhere), and a trace without it has absolute ``ts``
(base 0).

So the sampler stamps samples with a monotonic clock (``time.perf_counter_ns``, CLOCK_MONOTONIC:
immune to wall-clock steps during a capture) and maps them to Unix time the way torch does: a
(wall, monotonic) pair is measured at the start and at the end of every sampling segment (the
tightest of a few back-to-back readings) and times in between are interpolated linearly. Events are
then written with ``ts = (unix_ns - baseTimeNanoseconds) / 1000`` of the file they go into, so they
line up with the profiler's events in that file, and the sidecar's merge shifts them with the rest.

The output
----------
Per sampled stack level, one ``ph: "X"`` slice per run of consecutive samples in which the frame at
that level and every frame above it stayed the same (a flame chart): children lie within their
parents, slices of one level never overlap, and events come sorted by (start, depth), parents first.
A run covers its samples from the first sample's time to the last sample's time plus one sampling
period (less if the next sample or the stop came sooner), so a slice never claims more than one
period after its last sample. Names are ``qualname (file.py:first line of the function)``, args
``{"file", "line", "samples", "depth"}``, category ``python_function`` (what Kineto uses for Python
frames: the project's analyser files them as Python frames, ``Kind.PYTHON``), on a track of the same
pid with a tid of its own (``TRACK_TID_BASE`` + the target's native thread id) named
``python stacks (sampled) · thread <native id>`` by a ``thread_name`` metadata event. A stop forced
by a bound adds an instant event naming the reason.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
import weakref
from array import array
from collections import Counter
from operator import attrgetter
from typing import Any, Callable, Iterable, Iterator, Optional

from .kineto_file import insert_events
from .stack_weights import sample_weights, weight_cap

log = logging.getLogger(__name__)

TRACK_NAME = "python stacks (sampled)"
CATEGORY = "python_function"  # Kineto's category for Python frames
TRACK_TID_BASE = 1 << 30  # above any Linux thread id (at most 2**22), below 2**31
DEFAULT_HZ = 1000.0
DEFAULT_MAX_SAMPLES = 100_000  # 100 s at 1 kHz
DEFAULT_MAX_EVENTS = 200_000
DEFAULT_MAX_BYTES = 32 << 20  # estimated JSON bytes of the slices
DEFAULT_MAX_DEPTH = 128
_EVENT_OVERHEAD_BYTES = 150  # a slice's JSON beyond its name and file (measured: 135-145)
_IDLE_CHECK_S = 5.0  # a parked sampler thread checks this often whether its sampler was dropped
_CODE_OF = attrgetter("f_code")
_OWN_FILE = __file__[:-1] if __file__.endswith((".pyc", ".pyo")) else __file__

# Why sampling ended early (summary()["stop_reason"]); None while it may go on.
MAX_SAMPLES = "max_samples reached"
MAX_EVENTS = "max_events reached"
MAX_BYTES = "max_bytes reached"
TARGET_EXITED = "target thread exited"


class _Segment:
    """One start..stop stretch of sampling: samples [lo, hi) and the clock pairs around it."""

    __slots__ = ("lo", "hi", "start_ns", "end_ns", "cal0", "cal1")

    def __init__(self, lo: int, cal0: tuple[int, int]) -> None:
        self.lo = self.hi = lo
        self.start_ns: Optional[int] = None  # monotonic: when start() was called
        self.end_ns: int = 0  # monotonic: when the last run ends (stop time, capped)
        self.cal0 = cal0  # (monotonic ns, unix ns) at the start
        self.cal1 = cal0  # ... and at the end

    def to_unix(self, t: int) -> int:
        (m0, w0), (m1, w1) = self.cal0, self.cal1
        if m1 <= m0:
            return w0 + (t - m0)
        return w0 + (t - m0) + ((t - m0) * ((w1 - w0) - (m1 - m0))) // (m1 - m0)


def _calibrate(clock: Callable[[], int], wall: Callable[[], int], tries: int = 5) -> tuple[int, int]:
    """(monotonic, unix) ns at one instant: the tightest of a few back-to-back wall readings."""
    best = None
    for _ in range(tries):
        w0 = wall()
        m = clock()
        w1 = wall()
        if best is None or w1 - w0 < best[0]:
            best = (w1 - w0, m, (w0 + w1) // 2)
    return best[1], best[2]  # type: ignore[index]


def _native_id(ident: int) -> Optional[int]:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return getattr(thread, "native_id", None)
    return None


class StackSampler:
    """Samples one thread's Python stack from a daemon thread while started (module docstring).

    ``thread_id`` is the target's ``threading.get_ident()`` (the key of ``sys._current_frames()``),
    or None to give it to ``start()``. ``skip_files``: frames whose ``co_filename`` starts with one
    of these are left out of the stacks (this module's own frames always are). ``clock`` must be a
    monotonic nanosecond clock, ``wall_clock`` Unix time in ns (the trace's clock); both injectable
    for tests. The sampling thread starts here (not in ``start()``, which runs on the step thread)
    and parks until ``start()``; ``close()`` ends it (and so does dropping the sampler).
    """

    def __init__(
        self,
        thread_id: Optional[int] = None,
        hz: float = DEFAULT_HZ,
        *,
        max_samples: int = DEFAULT_MAX_SAMPLES,
        max_events: int = DEFAULT_MAX_EVENTS,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_depth: int = DEFAULT_MAX_DEPTH,
        skip_files: Iterable[str] = (),
        clock: Callable[[], int] = time.perf_counter_ns,
        wall_clock: Callable[[], int] = time.time_ns,
        name: str = "inference-sidecar-stack-sampler",
    ) -> None:
        if not 0 < hz <= 100_000:
            raise ValueError(f"hz must be in (0, 100000], got {hz}")
        for label, value in (("max_samples", max_samples), ("max_events", max_events),
                             ("max_bytes", max_bytes), ("max_depth", max_depth)):
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        self.thread_id = thread_id
        self.hz = float(hz)
        self.period_ns = max(1, int(round(1e9 / hz)))
        self.max_samples, self.max_events, self.max_bytes, self.max_depth = max_samples, max_events, max_bytes, max_depth
        self.skip_files = tuple(skip_files) + (_OWN_FILE,)
        self._clock, self._wall = clock, wall_clock
        # Frames: index -> (qualname, file, first line); the code objects stay referenced so that
        # their id() (the cache key) cannot be reused while the cache holds it.
        self._frames: list[tuple[str, str, int]] = []
        self._frame_names: list[str] = []
        self._frame_bytes: list[int] = []
        self._code_ids: dict[int, int] = {}  # id(code) -> frame index, -1 for a skipped frame
        self._code_refs: list[Any] = []
        self._cut_frame = self._add_frame(f"[stack cut at {max_depth} frames]", "", 0)
        # Samples: monotonic time, stack index, executing line of the innermost kept frame.
        self._t = array("q")
        self._s = array("i")
        self._line = array("i")
        self._wait = array("q")  # ns from the tick the sample was due at to the sample (GIL wait)
        self._stacks: list[tuple[int, ...]] = []  # index -> frame indices, innermost first
        self._stack_ids: dict[tuple[int, ...], int] = {}
        # (previous stack, stack) -> (levels kept from the root, new slices, their estimated bytes)
        self._transitions: dict[tuple[int, int], tuple[int, int, int]] = {}
        self._segments: list[_Segment] = []
        self._slices = 0
        self._bytes = 0
        self._missed = 0
        self._truncated = 0
        self._cpu_ns = 0
        self._active_ns = 0
        self.stop_reason: Optional[str] = None
        self.error: Optional[str] = None
        self._native: Optional[int] = None
        self._native_for: Optional[int] = None
        # Control: _want and _gen are written by start()/stop() (any thread), read by the sampler.
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._want = False
        self._gen = 0
        self._stop_ns: Optional[int] = None
        self._start_ns: Optional[int] = None
        self._closed = False
        self._thread = threading.Thread(target=_sampler_main, args=(weakref.ref(self), self._wake),
                                        name=name, daemon=True)
        self._thread.start()

    # -- control: any thread, never raises --------------------------------------------------------
    def start(self, thread_id: Optional[int] = None) -> bool:
        """Begin (or resume) sampling; ``thread_id`` replaces the target if given. Returns False
        when the sampler cannot sample any more (closed, or stopped for good: ``stop_reason``)."""
        try:
            with self._lock:
                if self._closed or self.stop_reason is not None:
                    return False
                if thread_id is not None:
                    self.thread_id = thread_id
                if self.thread_id is None:
                    return False
                self._stop_ns = None
                self._start_ns = self._clock()
                self._gen += 1
                self._want = True
                self._idle.clear()
            self._wake.set()
            return True
        except Exception:  # pragma: no cover - nothing above raises in practice
            return False

    def stop(self) -> None:
        """Stop sampling (the sampler finishes the sample in flight, if any, and parks)."""
        try:
            if self._want:
                self._stop_ns = self._clock()
                self._want = False
        except Exception:  # pragma: no cover - an injected clock that raises
            self._want = False

    def wait_idle(self, timeout: Optional[float] = None) -> bool:
        """Wait until the sampling thread is parked (after ``stop()``); False on timeout."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Stop for good and end the sampling thread (returns without waiting for it)."""
        self.stop()
        with self._lock:
            self._closed = True
        self._wake.set()

    def __enter__(self) -> "StackSampler":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def active(self) -> bool:
        return self._want

    @property
    def samples(self) -> int:
        return len(self._t)

    @property
    def track_tid(self) -> int:
        """The tid of the sampled-stacks track: ``TRACK_TID_BASE`` + the target's native id."""
        native = self._native if self._native is not None else (self.thread_id or 0) & 0x3FFFFF
        return TRACK_TID_BASE + native

    # -- the sampling thread ----------------------------------------------------------------------
    def _serve_once(self) -> bool:
        """Handle one wakeup; False when the thread should end."""
        with self._lock:
            self._wake.clear()
            if self._closed:
                self._idle.set()
                return False
            gen, want = self._gen, self._want
        if want:
            try:
                self._segment(gen)
            except Exception as exc:  # a bug must not kill the thread: stop for good, say why
                log.warning("inference-sidecar: stack sampler stopped: %s", exc)
                self.error = f"{type(exc).__name__}: {exc}"
                self.stop_reason = f"error: {self.error}"
                self._want = False
                self._recover()
        with self._lock:
            if self._want and self._gen != gen and self.stop_reason is None and not self._closed:
                self._wake.set()  # restarted while finishing: go again at once
            elif not self._wake.is_set():
                self._idle.set()
        return True

    def _segment(self, gen: int) -> None:
        clock = self._clock
        tid = self.thread_id
        if self._native_for != tid:
            self._native, self._native_for = _native_id(tid), tid
        cpu0 = time.thread_time_ns()
        seg = _Segment(len(self._t), _calibrate(clock, self._wall))
        seg.start_ns = self._start_ns
        self._segments.append(seg)
        period = self.period_ns
        depth_range = range(self.max_depth)
        code_of = _CODE_OF
        get_frames = sys._current_frames
        code_ids = self._code_ids
        intern = self._intern
        stack_ids = self._stack_ids
        stacks = self._stacks
        transitions = self._transitions
        t_append, s_append, l_append, w_append = self._t.append, self._s.append, self._line.append, self._wait.append
        cut = self._cut_frame
        sleep = time.sleep
        prev = -1  # a segment starts new slices at every level
        n = len(self._t)
        reason = None
        t0 = next_t = clock()
        t = t0
        while self._want and self._gen == gen:
            frame = get_frames().get(tid)
            t = clock()
            if frame is None:
                reason = TARGET_EXITED
                break
            # The walk does as little per frame as Python allows; the lookups run in C (map).
            walked = []
            keep = walked.append
            f = frame
            for _ in depth_range:
                keep(f)
                f = f.f_back
                if f is None:
                    break
            cut_off = f is not None
            frame = f = None  # noqa: F841 - hold no frame beyond this sample
            ids = list(map(code_ids.get, map(id, map(code_of, walked))))
            if None in ids:  # code never seen before
                ids = [intern(fr.f_code) if fid is None else fid for fid, fr in zip(ids, walked)]
            if -1 in ids:  # skipped files
                kept = [k for k, fid in enumerate(ids) if fid >= 0]
                line = (walked[kept[0]].f_lineno or 0) if kept else 0
                ids = [ids[k] for k in kept]
            else:
                line = walked[0].f_lineno or 0
            walked = None
            if cut_off:
                ids.append(cut)
                self._truncated += 1
            key = tuple(ids)
            sid = stack_ids.get(key)
            if sid is None:
                sid = stack_ids[key] = len(stacks)
                stacks.append(key)
            if sid != prev:
                step = transitions.get((prev, sid))
                if step is None:
                    step = self._transition(prev, sid)
                if self._slices + step[1] > self.max_events:
                    reason = MAX_EVENTS
                    break
                if self._bytes + step[2] > self.max_bytes:
                    reason = MAX_BYTES
                    break
                self._slices += step[1]
                self._bytes += step[2]
                prev = sid
            t_append(t)
            s_append(sid)
            l_append(line)
            w_append(t - next_t)
            n += 1
            if n >= self.max_samples:
                reason = MAX_SAMPLES
                t = clock()
                break
            next_t += period
            now = clock()
            wait = next_t - now
            if wait > 0:
                sleep(wait * 1e-9)
            else:  # late (the GIL or the CPU was busy): skip to the next tick still ahead
                late = -wait // period + 1
                self._missed += late
                next_t += late * period
                sleep((next_t - now) * 1e-9)
        end = clock()
        stop_ns = self._stop_ns
        if reason is None and stop_ns is not None:
            end = max(stop_ns, t0)
            while len(self._t) > seg.lo and self._t[-1] > stop_ns:  # taken after stop(): not wanted
                self._t.pop()
                self._s.pop()
                self._line.pop()
                self._wait.pop()
        elif reason is not None:
            end = t
        seg.hi = len(self._t)
        seg.end_ns = end
        seg.cal1 = _calibrate(clock, self._wall)
        self._active_ns += max(0, end - t0)
        self._cpu_ns += time.thread_time_ns() - cpu0
        if reason is not None:
            self.stop_reason = reason
            self._want = False

    def _recover(self) -> None:
        """After an error inside a segment: equal-length sample columns, the last segment closed."""
        n = min(len(self._t), len(self._s), len(self._line), len(self._wait))
        for column in (self._t, self._s, self._line, self._wait):
            del column[n:]
        if self._segments:
            seg = self._segments[-1]
            if seg.hi <= seg.lo:
                seg.hi = n
                seg.end_ns = self._t[n - 1] if n > seg.lo else seg.end_ns
                for i in range(seg.lo, n):  # slices need every transition of the segment
                    prev = self._s[i - 1] if i > seg.lo else -1
                    if self._s[i] != prev and (prev, self._s[i]) not in self._transitions:
                        self._transition(prev, self._s[i])

    def _add_frame(self, qualname: str, filename: str, firstline: int) -> int:
        fid = len(self._frames)
        base = os.path.basename(filename)
        name = f"{qualname} ({base}:{firstline})" if filename else qualname
        self._frames.append((qualname, filename, firstline))
        self._frame_names.append(name)
        self._frame_bytes.append(len(name) + len(filename) + _EVENT_OVERHEAD_BYTES)
        return fid

    def _intern(self, code: Any) -> int:
        filename = code.co_filename
        if filename.startswith(self.skip_files):
            fid = -1
        else:
            fid = self._add_frame(getattr(code, "co_qualname", code.co_name), filename, code.co_firstlineno)
        self._code_ids[id(code)] = fid
        self._code_refs.append(code)
        return fid

    def _transition(self, prev: int, sid: int) -> tuple[int, int, int]:
        new = self._stacks[sid]
        old = self._stacks[prev] if prev >= 0 else ()
        keep = 0
        limit = min(len(new), len(old))
        while keep < limit and new[-1 - keep] == old[-1 - keep]:
            keep += 1
        fresh = len(new) - keep
        nbytes = sum(self._frame_bytes[f] for f in new[: fresh])
        step = self._transitions[(prev, sid)] = (keep, fresh, nbytes)
        return step

    # -- results: any thread, after stop() ---------------------------------------------------------
    def _settle(self, timeout: float) -> None:
        self.stop()
        if not self._idle.wait(timeout):
            log.warning("inference-sidecar: stack sampler still busy after %.1f s; using what it has", timeout)

    def iter_events(self, base_time_ns: int = 0, pid: Optional[int] = None, timeout: float = 2.0) -> Iterator[dict]:
        """The sampled slices as Chrome trace events (module docstring), ``ts`` relative to
        ``base_time_ns`` (a Kineto trace's ``baseTimeNanoseconds``; 0: absolute Unix µs). Stops
        sampling first. Yields one event at a time; the slice table it builds holds five numbers
        per slice."""
        self._settle(timeout)
        pid = os.getpid() if pid is None else pid
        tid = self.track_tid
        slices = self._build_slices()
        if not slices and not (self.stop_reason and self._segments):
            return
        first_ts = (slices[0][0] - base_time_ns) / 1000 if slices else 0.0
        native = self._native if self._native is not None else self.thread_id
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": first_ts,
               "args": {"name": f"{TRACK_NAME} · thread {native}"}}
        yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": first_ts,
               "args": {"sort_index": tid}}
        names, frames = self._frame_names, self._frames
        for start, end, depth, fid, count in slices:
            _q, filename, firstline = frames[fid]
            ts, dur = _us_span(start - base_time_ns, end - base_time_ns)
            yield {"ph": "X", "cat": CATEGORY, "name": names[fid], "pid": pid, "tid": tid, "ts": ts, "dur": dur,
                   "args": {"file": filename, "line": firstline, "samples": count, "depth": depth}}
        if self.stop_reason is not None and self._segments:
            seg = self._segments[-1]
            yield {"ph": "i", "s": "t", "cat": CATEGORY, "name": f"stack sampler stopped: {self.stop_reason}",
                   "pid": pid, "tid": tid, "ts": (seg.to_unix(seg.end_ns) - base_time_ns) / 1000,
                   "args": {"reason": self.stop_reason, "samples": self.samples}}

    def events(self, base_time_ns: int = 0, pid: Optional[int] = None, timeout: float = 2.0) -> list[dict]:
        """``iter_events`` as a list."""
        return list(self.iter_events(base_time_ns, pid, timeout))

    def _build_slices(self) -> list[list]:
        """[start_unix_ns, end_unix_ns, depth, frame, samples] per slice, sorted by (start, depth)."""
        out: list[list] = []
        times, sids, stacks, transitions, period = self._t, self._s, self._stacks, self._transitions, self.period_ns
        for seg in self._segments:
            if seg.hi <= seg.lo:
                continue
            to_unix = seg.to_unix
            open_: list[list] = []  # per level: the slice being extended, [start, end, depth, fid, first sample]
            prev_sid, prev_t = -1, 0
            for i in range(seg.lo, seg.hi):
                t, sid = times[i], sids[i]
                if sid != prev_sid:
                    step = transitions.get((prev_sid, sid)) or self._transition(prev_sid, sid)
                    keep = step[0]
                    if prev_sid >= 0 and keep < len(open_):
                        end = to_unix(prev_t + min(t - prev_t, period))
                        for sl in open_[keep:]:
                            sl[1] = end
                            sl[4] = i - sl[4]
                        del open_[keep:]
                    stack = stacks[sid]
                    ut = to_unix(t)
                    for depth in range(keep, len(stack)):
                        sl = [ut, 0, depth, stack[-1 - depth], i]
                        out.append(sl)
                        open_.append(sl)
                    prev_sid = sid
                prev_t = t
            end = to_unix(prev_t + max(1, min(period, seg.end_ns - prev_t)))
            for sl in open_:
                sl[1] = end
                sl[4] = seg.hi - sl[4]
        return out

    def append_to_trace(self, path: str, base_time_ns: Optional[int] = None, pid: Optional[int] = None,
                        timeout: float = 2.0) -> int:
        """Add the sampled events to the plain-JSON Kineto trace at ``path`` (the file is rewritten
        through a temporary file in the same folder, then replaced). The events go first in
        ``traceEvents``; the rest of the file is copied as bytes, 1 MiB at a time, so memory does
        not grow with the trace. ``base_time_ns``: the file's ``baseTimeNanoseconds`` unless given.
        Returns the number of events added. Raises ValueError for a file that is not a JSON object
        with a ``traceEvents`` array, OSError for I/O errors; the file is left as it was then."""
        self._settle(timeout)
        return insert_events(path, lambda base: self.iter_events(base, pid, timeout), base_time_ns)

    # -- summary -----------------------------------------------------------------------------------
    def summary(self, top: int = 10, timeout: float = 2.0) -> dict:
        """Counts and the hottest frames, JSON-ready.

        ``top_self``: the innermost frame (function, file, executing line); ``top_total``: functions
        anywhere on the stack (a recursive function counts once per sample). Rows are ranked by
        sampled time, not by sample count: each sample stands for the time since the previous one
        (capped at ``weight_cap_ms``), see stack_weights.py. Counts alone would be
        biased: the sampler reaches the GIL about every switch interval (5 ms) while the target
        runs Python, but at once while it sits in a call that releases the GIL (a torch op, a
        wait), so Python-heavy code gets fewer samples per second than waits. ``share`` is of
        the sampled time; ``samples`` the plain count. Stops sampling first, as ``events`` does."""
        if not self._idle.is_set():
            self._settle(timeout)
        n = len(self._t)
        active_s = self._active_ns / 1e9
        weights = sample_weights(self._t, self._wait, self._segments, self.period_ns)
        total_weight = sum(weights) or 1
        stacks, cut = self._stacks, self._cut_frame
        self_time: Counter = Counter()
        self_count: Counter = Counter()
        stack_time: Counter = Counter()
        stack_count: Counter = Counter()
        for sid, line, w in zip(self._s, self._line, weights):
            stack_time[sid] += w
            stack_count[sid] += 1
            stack = stacks[sid]
            if stack and stack[0] != cut:
                self_time[(stack[0], line)] += w
                self_count[(stack[0], line)] += 1
        total_time: Counter = Counter()
        total_count: Counter = Counter()
        for sid, w in stack_time.items():
            for fid in set(stacks[sid]):
                if fid != cut:
                    total_time[fid] += w
                    total_count[fid] += stack_count[sid]

        def row(fid: int, line: int, w: int, count: int) -> dict:
            qualname, filename, firstline = self._frames[fid]
            return {"function": qualname, "file": filename, "line": line, "first_line": firstline,
                    "samples": count, "time_ms": round(w / 1e6, 3), "share": round(w / total_weight, 4)}

        return {
            "samples": n,
            "dropped": self._missed,
            "target_hz": self.hz,
            "achieved_hz": round(n / active_s, 1) if active_s > 0 else 0.0,
            "active_s": round(active_s, 6),
            "sampled_s": round(sum(weights) / 1e9, 6),
            "weight_cap_ms": round(weight_cap(self.period_ns) / 1e6, 3),
            "sampler_cpu_s": round(self._cpu_ns / 1e9, 6),
            "sampler_cpu_share": round(self._cpu_ns / self._active_ns, 4) if self._active_ns else 0.0,
            "segments": len(self._segments),
            "truncated_stacks": self._truncated,
            "distinct_stacks": len(self._stacks),
            "events": self._slices,
            "estimated_bytes": self._bytes,
            "stop_reason": self.stop_reason,
            "top_self": [row(fid, line, w, self_count[(fid, line)]) for (fid, line), w in self_time.most_common(top)],
            "top_total": [row(fid, self._frames[fid][2], w, total_count[fid]) for fid, w in total_time.most_common(top)],
        }

    def headline(self) -> str:
        """One line for a verdict: ``python stacks: 1843 samples at 612 Hz; top: f (x.py:12) 41 %``
        (the share of sampled time of the innermost frame's line)."""
        s = self.summary(top=1)
        if not s["samples"]:
            return "python stacks: no samples" + (f" ({s['stop_reason']})" if s["stop_reason"] else "")
        text = f"python stacks: {s['samples']} samples at {s['achieved_hz']:.0f} Hz"
        if s["top_self"]:
            t = s["top_self"][0]
            text += f"; top: {t['function']} ({os.path.basename(t['file'])}:{t['line']}) {t['share'] * 100:.0f} %"
        if s["stop_reason"]:
            text += f"; stopped early: {s['stop_reason']}"
        return text


def _us_span(start_ns: int, end_ns: int) -> tuple[float, float]:
    """``ts`` and ``dur`` in µs such that ``ts + dur``, computed in doubles by whoever reads the
    trace, is never after ``end_ns / 1000`` as a double: a slice that ends where the next one
    starts must not overlap it by a rounding error (at Kineto's magnitudes, ts near 4.5e12 µs, one
    ulp is about 1 ns), or a reader nests the next slice inside it."""
    ts, end = start_ns / 1000, end_ns / 1000
    dur = end - ts
    while dur > 0 and ts + dur > end:
        dur = math.nextafter(dur, 0.0)
    return ts, dur


def _sampler_main(ref: "weakref.ref[StackSampler]", wake: threading.Event) -> None:
    """The sampling thread. It holds its sampler only while serving a wakeup, so a sampler nobody
    references any more is collected and the thread ends at its next idle check."""
    while True:
        if not wake.wait(_IDLE_CHECK_S):
            if ref() is None:
                return
            continue
        sampler = ref()
        if sampler is None:
            return
        try:
            if not sampler._serve_once():
                return
        finally:
            del sampler
