"""Python stacks of one thread by sampling, not tracing: the probe's half, which samples and hands over.

torch.profiler's ``with_stack`` traces every Python call and processes them in ``stop()`` on the
step thread (issue 15: a 13.4 s stall on real vLLM). ``StackSampler`` instead reads ONE target
thread's stack, ``sys._current_frames()[thread_id]``, from a daemon thread of its own at a fixed
rate (default 1000 Hz), only while it is started, and keeps the samples as they are. After the
capture, ``dump`` writes them, unprocessed, to the raw samples file beside the exported trace
(sidecar/stacks/samples_file.py): a few buffer copies and one msgpack encoding, no loop over the samples.
What the sampler keeps while it samples (the interned frames and stacks, the sample columns, the
segments and their clock pairs) is its ``SampleStore`` (sidecar/stacks/sample_store.py).
The sidecar turns them into flame-chart slices in the process's trace and into the summary
(sidecar/stacks/sampled.py), off the engine process: there, that Python work would hold the
GIL against the step thread (measured on a 2-core host: a worker's export went from 13-36 ms to
50-78 ms when it built the slices and rewrote its trace itself).

What each thread pays
---------------------
* The target (the engine's step thread): nothing of the sampler runs on it. ``start()`` reads a
  clock, sets a flag under an uncontended lock and sets an Event; ``stop()`` reads a clock and
  sets a flag. Neither waits for the sampler, and neither raises. Between two samples of a
  segment the sampler holds the last sample's frames (not the thread object), so that the next
  sample walks only the frames that are new: it walks from the innermost frame out and stops at the
  first plain function frame (not a generator or coroutine, which can be resumed under another
  caller) that the last sample held. That frame is the same object, held, so the same call, still
  running, so its callers are the same ones: their ids come from the last sample. A function that
  returned since the last sample keeps its locals until the next sample (a period, up to the
  switch interval when the target holds the GIL); after ``stop()`` the sampler holds no frame,
  only code objects (name, file, first line).
* The GIL: every sample needs it, so a sample delays the target by its cost (a walk of the frames
  new since the last sample, up to ``max_depth``, with a per-code-object cache in the store;
  benchmarks/bench_sampler.py measures it).
  While the target runs pure Python it holds the GIL, and the sampler gets it only when the
  interpreter forces a switch, after ``sys.getswitchinterval()`` (5 ms by default): against such
  code the achieved rate is about 150-200 Hz whatever ``hz`` says; against code that releases the
  GIL (torch ops, I/O, waits) it is the requested rate. So each sample keeps how long it waited
  past its tick (the summary weighs samples by time with it, sidecar/stacks/weights.py),
  and the file carries this process's switch interval. The sampler thread keeps the default OS
  priority on purpose: a low-priority thread that holds the GIL and is preempted would stall every
  other thread (priority inversion).
* The export thread (sidecar/probe/capture/profiler.py), after the trace: ``dump``, a copy of each column's
  buffer and one msgpack encoding in C (about 0.2 ms for 2,000 samples, benchmarks/bench_sampler.py).
* Idle: the thread waits on an Event; no polling, no wakeups.
* Bounds: at most ``max_samples`` samples, ``max_events`` output slices and ``max_bytes`` (estimated
  JSON size of the slices the sidecar will add to the trace), each counted while sampling (the
  store's table of stack-to-stack transitions makes that a dict lookup per change of stack); the first one
  reached stops the sampler for good, and ``stop_reason`` says which. A stack deeper than
  ``max_depth`` keeps its innermost ``max_depth`` frames (skipped ones included) under a synthetic
  root frame ``[stack cut at N frames]``.

Samples are stamped with a monotonic clock, mapped onto the trace's Unix time by the clock pairs of
each segment (sidecar/stacks/sample_store.py, "The clock").
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import time
import weakref
from operator import attrgetter
from typing import Any, Callable, Iterable, Optional

from .samples_file import RawSamples, encode
from . import sample_store
from .sample_store import SampleStore

log = logging.getLogger(__name__)

DEFAULT_HZ = 1000.0
DEFAULT_MAX_SAMPLES = 100_000  # 100 s at 1 kHz
DEFAULT_MAX_EVENTS = 200_000
DEFAULT_MAX_BYTES = 32 << 20  # estimated JSON bytes of the slices
DEFAULT_MAX_DEPTH = 128
_IDLE_CHECK_S = 5.0  # a parked sampler thread checks this often whether its sampler was dropped
_CODE_OF = attrgetter("f_code")
# Frames that can be suspended and resumed under another caller: never a walk's stopping point.
_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE
# The sampler's own frames (this module's, its store's) are never part of a stack it records.
_OWN_FILES = tuple(f[:-1] if f.endswith((".pyc", ".pyo")) else f for f in (__file__, sample_store.__file__))

# Why sampling ended early (``stop_reason``, the summary's "stop_reason"); None while it may go on.
MAX_SAMPLES = "max_samples reached"
MAX_EVENTS = "max_events reached"
MAX_BYTES = "max_bytes reached"
TARGET_EXITED = "target thread exited"


def _native_id(ident: int) -> Optional[int]:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return getattr(thread, "native_id", None)
    return None


class StackSampler:
    """Samples one thread's Python stack from a daemon thread while started (module docstring).

    ``thread_id`` is the target's ``threading.get_ident()`` (the key of ``sys._current_frames()``),
    or None to give it to ``start()``. ``skip_files``: frames whose ``co_filename`` starts with one
    of these are left out of the stacks (the sampler's own frames always are). ``clock`` must be a
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
        self.skip_files = tuple(skip_files) + _OWN_FILES
        self._clock, self._wall = clock, wall_clock
        self._store = SampleStore(self.skip_files, max_depth)
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
        return len(self._store)

    # -- the hand-over: any thread, after stop() ---------------------------------------------------
    def raw(self, timeout: float = 2.0) -> RawSamples:
        """The samples so far, as the raw samples file holds them (sidecar/stacks/samples_file.py). Stops
        sampling first and waits up to ``timeout`` s for the sampling thread to park. Copies the
        columns' buffers; no loop over the samples."""
        self.stop()
        if not self._idle.wait(timeout):
            log.warning("inference-sidecar: stack sampler still busy after %.1f s; using what it has", timeout)
        return self._store.raw(
            pid=os.getpid(), thread_id=self.thread_id, native_id=self._native, hz=self.hz,
            period_ns=self.period_ns, switch_interval_s=sys.getswitchinterval(),
            stop_reason=self.stop_reason, error=self.error)

    def dump(self, path: str, timeout: float = 2.0) -> int:
        """Write ``raw()`` to ``path`` (created or replaced); returns the bytes written. Raises
        OSError; a file cut short by one is the caller's to delete."""
        data = encode(self.raw(timeout))
        with open(path, "wb") as f:
            f.write(data)
        return len(data)

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
                self._store.recover()
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
        store = self._store
        seg = store.open_segment(self._start_ns, clock, self._wall)
        period = self.period_ns
        depth_range = range(self.max_depth)
        code_of = _CODE_OF
        get_frames = sys._current_frames
        code_ids = store.code_ids
        intern = store.intern
        stack_ids = store.stack_ids
        stacks = store.stacks
        transitions = store.transitions
        t_append, s_append, l_append, w_append = store.t.append, store.s.append, store.line.append, store.wait.append
        cut = store.cut_frame
        max_depth = self.max_depth
        # The last sample's chain, root first, held only within this segment (module docstring):
        chain_frames: list = []  # its frames
        chain_ids: list = []  # their frame indices (-1: a skipped file)
        at_root: dict = {}  # id(frame) -> its place in chain_frames; plain function frames only
        sleep = time.sleep
        prev = -1  # a segment starts new slices at every level
        n = len(store)
        reason = None
        t0 = next_t = clock()
        t = t0
        while self._want and self._gen == gen:
            frame = get_frames().get(tid)
            t = clock()
            if frame is None:
                reason = TARGET_EXITED
                break
            # Only the frames new since the last sample are walked: the walk stops at the first
            # plain function frame that the last sample also held (the same object, so the same
            # call, so the same callers: the module docstring), and the outer frames' ids come
            # from the last sample.
            new = []
            keep = new.append
            f = frame
            r = None
            for _ in depth_range:
                r = at_root.get(id(f))
                if r is not None:
                    break
                keep(f)
                f = f.f_back
                if f is None:
                    break
            if new:
                new_ids = list(map(code_ids.get, map(id, map(code_of, new))))
                if None in new_ids:  # code never seen before
                    new_ids = [intern(fr.f_code) if fid is None else fid for fid, fr in zip(new_ids, new)]
            else:
                new_ids = new
            if r is not None and r + 1 + len(new) <= max_depth:
                for fr in chain_frames[r + 1:]:
                    at_root.pop(id(fr), None)
                del chain_frames[r + 1:], chain_ids[r + 1:]
                base = r + 1
                cut_off = False
            else:  # nothing shared, or too deep: the whole chain is this sample's walk
                if r is not None:  # too deep with the shared frames: walk it all again
                    new = []
                    keep = new.append
                    f = frame
                    for _ in depth_range:
                        keep(f)
                        f = f.f_back
                        if f is None:
                            break
                    new_ids = list(map(code_ids.get, map(id, map(code_of, new))))
                    if None in new_ids:
                        new_ids = [intern(fr.f_code) if fid is None else fid for fid, fr in zip(new_ids, new)]
                cut_off = f is not None
                at_root.clear()
                chain_frames.clear()
                chain_ids.clear()
                base = 0
            frame = f = None  # noqa: F841
            new.reverse()
            new_ids.reverse()
            chain_frames += new
            chain_ids += new_ids
            if not cut_off:  # a cut chain's outer frames are unknown: never matched against
                for k, fr in enumerate(new, base):
                    if not fr.f_code.co_flags & _RESUMABLE:
                        at_root[id(fr)] = k
            new = None
            ids = chain_ids[::-1]
            if -1 in ids:  # skipped files
                kept = [k for k, fid in enumerate(ids) if fid >= 0]
                line = (chain_frames[-1 - kept[0]].f_lineno or 0) if kept else 0
                ids = [ids[k] for k in kept]
            else:
                line = chain_frames[-1].f_lineno or 0
            if cut_off:
                ids.append(cut)
                store.truncated += 1
            key = tuple(ids)
            sid = stack_ids.get(key)
            if sid is None:
                sid = stack_ids[key] = len(stacks)
                stacks.append(key)
            if sid != prev:
                step = transitions.get((prev, sid))
                if step is None:
                    step = store.transition(prev, sid)
                if store.slices + step[1] > self.max_events:
                    reason = MAX_EVENTS
                    break
                if store.bytes + step[2] > self.max_bytes:
                    reason = MAX_BYTES
                    break
                store.slices += step[1]
                store.bytes += step[2]
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
                store.missed += late
                next_t += late * period
                sleep((next_t - now) * 1e-9)
        end = clock()
        stop_ns = self._stop_ns
        if reason is None and stop_ns is not None:
            end = max(stop_ns, t0)
            store.drop_after(seg, stop_ns)  # taken after stop(): not wanted
        elif reason is not None:
            end = t
        store.close_segment(seg, end, clock, self._wall)
        store.active_ns += max(0, end - t0)
        store.cpu_ns += time.thread_time_ns() - cpu0
        if reason is not None:
            self.stop_reason = reason
            self._want = False


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
