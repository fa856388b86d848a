"""A probe's sampled Python stacks made readable, in the sidecar: flame-chart slices and a summary.

A probe's ``StackSampler`` (sidecar/stacks/sampler.py) only samples, and hands its samples over
unprocessed in the raw samples file (sidecar/stacks/samples_file.py). Here, on the sidecar's low-priority
export thread (sidecar/service/export/merge.py), they become the Chrome-trace events added to that
process's trace (``iter_events``) and the summary of its hottest lines and functions (``summary``),
which the capture's JSON, its ``python_stacks`` summary section and its headline show.

The output
----------
Per sampled stack level, one ``ph: "X"`` slice per run of consecutive samples in which the frame at
that level and every frame above it stayed the same (a flame chart): children lie within their
parents, slices of one level never overlap, and events come sorted by (start, depth), parents first.
A run covers its samples from the first sample's time to the last sample's time plus one sampling
period (less if the next sample or the stop came sooner), so a slice never claims more than one
period after its last sample. Names are ``qualname (file.py:first line of the function)``, args
``{"file", "line", "samples", "depth"}``, category ``python_function`` (what Kineto uses for Python
frames: the project's analyser files them as Python frames, ``Kind.PYTHON``), on a track of the
sampled process's pid with a tid of its own (``TRACK_TID_BASE`` + the target's native thread id)
named ``python stacks (sampled) · thread <native id>`` by a ``thread_name`` metadata event. A stop
forced by a bound adds an instant event naming the reason.

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
(the merge reads it from anywhere), and a trace without it has absolute ``ts`` (base 0).

The sampler stamps samples with the monotonic clock and measures (monotonic, Unix) pairs at the
start and end of every sampling segment; times in between are interpolated linearly
(``Segment.to_unix``). Events are written with ``ts = (unix_ns - baseTimeNanoseconds) / 1000`` of
the trace they go into, so they line up with the profiler's events of that process, and the merge
shifts them with the rest.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterator, Optional

from .samples_file import Samples, frame_name
from .weights import sample_weights, weight_cap

TRACK_NAME = "python stacks (sampled)"
CATEGORY = "python_function"  # Kineto's category for Python frames
TRACK_TID_BASE = 1 << 30  # above any Linux thread id (at most 2**22), below 2**31


def track_tid(samples: Samples) -> int:
    """The tid of the sampled-stacks track: ``TRACK_TID_BASE`` + the target's native id."""
    raw = samples.raw
    native = raw.native_id if raw.native_id is not None else (raw.thread_id or 0) & 0x3FFFFF
    return TRACK_TID_BASE + native


def iter_events(samples: Samples, base_time_ns: int = 0, pid: Optional[int] = None) -> Iterator[dict]:
    """The sampled slices as Chrome trace events (module docstring), ``ts`` relative to
    ``base_time_ns`` (a Kineto trace's ``baseTimeNanoseconds``; 0: absolute Unix µs); ``pid``: the
    sampled process's unless given. Yields one event at a time; the slice table it builds holds
    five numbers per slice."""
    raw = samples.raw
    pid = raw.pid if pid is None else pid
    tid = track_tid(samples)
    slices = build_slices(samples)
    if not slices and not (raw.stop_reason and raw.segments):
        return
    first_ts = (slices[0][0] - base_time_ns) / 1000 if slices else 0.0
    native = raw.native_id if raw.native_id is not None else raw.thread_id
    yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": first_ts,
           "args": {"name": f"{TRACK_NAME} · thread {native}"}}
    yield {"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": first_ts,
           "args": {"sort_index": tid}}
    frames = raw.frames
    names = [frame_name(*frame) for frame in frames]
    for start, end, depth, fid, count in slices:
        _q, filename, firstline = frames[fid]
        ts, dur = _us_span(start - base_time_ns, end - base_time_ns)
        yield {"ph": "X", "cat": CATEGORY, "name": names[fid], "pid": pid, "tid": tid, "ts": ts, "dur": dur,
               "args": {"file": filename, "line": firstline, "samples": count, "depth": depth}}
    if raw.stop_reason is not None and raw.segments:
        seg = raw.segments[-1]
        yield {"ph": "i", "s": "t", "cat": CATEGORY, "name": f"stack sampler stopped: {raw.stop_reason}",
               "pid": pid, "tid": tid, "ts": (seg.to_unix(seg.end_ns) - base_time_ns) / 1000,
               "args": {"reason": raw.stop_reason, "samples": len(samples)}}


def events(samples: Samples, base_time_ns: int = 0, pid: Optional[int] = None) -> list[dict]:
    """``iter_events`` as a list."""
    return list(iter_events(samples, base_time_ns, pid))


def build_slices(samples: Samples) -> list[list]:
    """[start_unix_ns, end_unix_ns, depth, frame, samples] per slice, sorted by (start, depth)."""
    out: list[list] = []
    times, sids, stacks, period = samples.times, samples.stack_ids, samples.stacks, samples.raw.period_ns
    kept: dict[tuple[int, int], int] = {}  # (previous stack, stack) -> levels kept from the root
    for seg in samples.raw.segments:
        if seg.hi <= seg.lo:
            continue
        to_unix = seg.to_unix
        open_: list[list] = []  # per level: the slice being extended, [start, end, depth, fid, first sample]
        prev_sid, prev_t = -1, 0
        for i in range(seg.lo, seg.hi):
            t, sid = times[i], sids[i]
            if sid != prev_sid:
                keep = kept.get((prev_sid, sid))
                if keep is None:
                    keep = kept[(prev_sid, sid)] = _common_root(stacks[sid], stacks[prev_sid] if prev_sid >= 0 else ())
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


def _common_root(new: tuple[int, ...], old: tuple[int, ...]) -> int:
    """How many levels, from the root (the end of the tuples), two stacks share."""
    keep = 0
    limit = min(len(new), len(old))
    while keep < limit and new[-1 - keep] == old[-1 - keep]:
        keep += 1
    return keep


def summary(samples: Samples, top: int = 10) -> dict:
    """Counts and the hottest frames, JSON-ready.

    ``top_self``: the innermost frame (function, file, executing line); ``top_total``: functions
    anywhere on the stack (a recursive function counts once per sample). Rows are ranked by
    sampled time, not by sample count: each sample stands for the time since the previous one
    (capped at ``weight_cap_ms``), see weights.py. Counts alone would be biased: the sampler
    reaches the GIL about every switch interval (5 ms) while the target runs Python, but at once
    while it sits in a call that releases the GIL (a torch op, a wait), so Python-heavy code gets
    fewer samples per second than waits. ``share`` is of the sampled time; ``samples`` the plain
    count."""
    raw = samples.raw
    n = len(samples)
    active_s = raw.active_ns / 1e9
    weights = sample_weights(samples.times, samples.waits, raw.segments, raw.period_ns, raw.switch_interval_s)
    total_weight = sum(weights) or 1
    stacks, cut, frames = samples.stacks, raw.cut_frame, raw.frames
    self_time: Counter = Counter()
    self_count: Counter = Counter()
    stack_time: Counter = Counter()
    stack_count: Counter = Counter()
    for sid, line, w in zip(samples.stack_ids, samples.lines, weights):
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
        qualname, filename, firstline = frames[fid]
        return {"function": qualname, "file": filename, "line": line, "first_line": firstline,
                "samples": count, "time_ms": round(w / 1e6, 3), "share": round(w / total_weight, 4)}

    return {
        "samples": n,
        "dropped": raw.missed,
        "target_hz": raw.hz,
        "achieved_hz": round(n / active_s, 1) if active_s > 0 else 0.0,
        "active_s": round(active_s, 6),
        "sampled_s": round(sum(weights) / 1e9, 6),
        "weight_cap_ms": round(weight_cap(raw.period_ns, raw.switch_interval_s) / 1e6, 3),
        "sampler_cpu_s": round(raw.cpu_ns / 1e9, 6),
        "sampler_cpu_share": round(raw.cpu_ns / raw.active_ns, 4) if raw.active_ns else 0.0,
        "segments": len(raw.segments),
        "truncated_stacks": raw.truncated,
        "distinct_stacks": len(stacks),
        "events": raw.events,
        "estimated_bytes": raw.estimated_bytes,
        "stop_reason": raw.stop_reason,
        "top_self": [row(fid, line, w, self_count[(fid, line)]) for (fid, line), w in self_time.most_common(top)],
        "top_total": [row(fid, frames[fid][2], w, total_count[fid]) for fid, w in total_time.most_common(top)],
    }


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
