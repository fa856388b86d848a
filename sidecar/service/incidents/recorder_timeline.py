"""The flight recorder's last minutes as the home page draws them (``GET /recorder/timeline``,
docs/api.md): the rows of recorder_window.py made small on the sidecar's side, so that a browser gets
a few hundred points per process for an hour of steps, never the ring.

``build`` answers (every time Unix nanoseconds on the sidecar's clock, every ``*_ms`` milliseconds
rounded to the microsecond)::

    {"since_ns", "until_ns", "seconds", "points", "bucket_ns", "read_ns",
     "processes": [{"process": {...}, "error", "note",
        "steps": steps in the window, "slow_ms": the threshold of "over",
        "buckets": [{"start_ns", "steps", "working", "max_ms", "median_ms"}],   # non-empty ones
        "slow_steps": [{...the step's row..., "duration_ms", "gc_ms", "over": bool}],
        "gc": [{"start_ns", "duration_ms", "generation", "step_thread"}],
        "open_step": {"since_ns", "age_ms"} or null}],
     "requests": {"finished": N, "buckets": [{"start_ns", "count", "ttft_max_ms", "ttft_median_ms",
                                                "e2e_max_ms", "e2e_median_ms"}]},
     "in_flight": {"count": N, "requests": [{"id", "process", "arrived_ns", "age_ms", "phase",
                                             "prompt_tokens", "output_tokens"}]},   # oldest first
     "stuck": [{"process", "step", "since_ns", "age_s", "threshold_s", "frames"}],
     "marks": {"captures": [{"id", "state", "start_ns", "end_ns"}],
               "firings": [{"at_ns", "trigger", "name", "outcome", "metric", "observed_ms", "threshold_ms",
                            "capture"}]}}

The bucket math: the window ``[since_ns, until_ns]`` is cut into ``points`` buckets of ``bucket_ns =
ceil(span / points)``; a step goes to the bucket of its start (one that began before the window, to
the first). ``max_ms`` is the longest step of a bucket; ``median_ms`` the median of its working
steps (null when none worked). A step is slow (``over``) from ``slow_ms``: the caller's, else
``SLOW_FACTOR`` times the median working step of the process's window, at least ``SLOW_FLOOR_MS``.
``slow_steps`` holds the ``SLOW_TOP`` longest steps of the window and every step over, slowest first,
at most ``MAX_SLOW``: the marks a person clicks. GC pauses are those of at least ``gc_ms``, the
``MAX_GC_MARKS`` longest. A finished request goes to the bucket of its finish.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable, Optional, Sequence

import numpy as np

SECONDS_CHOICES = (60, 600, 3600)  # the page's 1, 10 and 60 minutes
DEFAULT_SECONDS = 600
DEFAULT_POINTS = 300
MIN_POINTS, MAX_POINTS = 10, 1000
SLOW_TOP = 50
MAX_SLOW = 200
SLOW_FACTOR = 4.0
SLOW_FLOOR_MS = 1.0
DEFAULT_GC_MS = 5.0
MAX_GC_MARKS = 200
MAX_IN_FLIGHT = 200
MAX_MARKS = 200
MAX_STUCK_FRAMES = 12
_TIMES = ("step", "start_ns", "end_ns", "working")  # step columns shown as they are; the others are counts


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)


def _ints(values: Any) -> np.ndarray:
    """A copy: a view of an ``array('q')`` would keep the store from growing it while it lives."""
    if hasattr(values, "typecode"):
        return np.frombuffer(values, dtype=np.int64).copy() if len(values) else np.zeros(0, np.int64)
    return np.array(values, dtype=np.int64)


def build(processes: Sequence[Any], *, since_ns: int, until_ns: int, points: int, read_ns: int = 0,
          slow_ms: Optional[float] = None, gc_ms: float = DEFAULT_GC_MS, stuck: Iterable[dict] = (),
          captures: Iterable[dict] = (), firings: Iterable[dict] = ()) -> dict:
    """The timeline (module docstring). ``processes``: recorder_window.ProcessRows (or anything with
    their attributes); ``stuck``: the watchdogs' reports (registry ``stuck``, with frames) by
    process label; ``captures``: capture JSON (``id``, ``state``, ``created_at``, ``finished_at``);
    ``firings``: trigger firings (``at`` in Unix seconds)."""
    bucket_ns = max(1, math.ceil((until_ns - since_ns) / points))
    views = [_process(rows, since_ns, until_ns, points, bucket_ns, slow_ms, gc_ms) for rows in processes]
    return {"since_ns": since_ns, "until_ns": until_ns, "seconds": round((until_ns - since_ns) / 1e9, 3),
            "points": points, "bucket_ns": bucket_ns, "read_ns": read_ns, "processes": views,
            "requests": _requests(processes, since_ns, until_ns, points, bucket_ns),
            "in_flight": _in_flight(processes, until_ns), "stuck": [_stuck(s) for s in stuck],
            "marks": {"captures": _capture_marks(captures, since_ns, until_ns),
                      "firings": _firing_marks(firings, since_ns, until_ns)}}


def _process(rows: Any, since_ns: int, until_ns: int, points: int, bucket_ns: int,
             slow_ms: Optional[float], gc_ms: float) -> dict:
    view: dict[str, Any] = {"process": rows.process, "error": rows.error, "note": rows.note, "steps": 0,
                            "slow_ms": slow_ms, "buckets": [], "slow_steps": [],
                            "gc": _gc_marks(rows.gc, since_ns, until_ns, gc_ms),
                            "open_step": ({"since_ns": rows.open_since_ns, "age_ms": _ms(until_ns - rows.open_since_ns)}
                                          if 0 < rows.open_since_ns <= until_ns else None)}
    if not rows.steps.get("end_ns"):
        return view
    start, end = _ints(rows.steps["start_ns"]), _ints(rows.steps["end_ns"])
    picked = np.nonzero((end >= since_ns) & (start <= until_ns))[0]
    if not len(picked):
        return view
    s = start[picked]
    duration = end[picked] - s
    working = _ints(rows.steps["working"])[picked] != 0 if "working" in rows.steps else np.ones(len(picked), bool)
    bucket = np.clip((s - since_ns) // bucket_ns, 0, points - 1)
    counts = np.bincount(bucket, minlength=points)
    worked = np.bincount(bucket[working], minlength=points)
    longest = np.zeros(points, np.int64)
    np.maximum.at(longest, bucket, duration)
    medians = _bucket_medians(bucket[working], duration[working], worked)
    view["steps"] = int(len(picked))
    view["buckets"] = [{"start_ns": since_ns + int(k) * bucket_ns, "steps": int(counts[k]), "working": int(worked[k]),
                        "max_ms": _ms(longest[k]), "median_ms": _ms(medians[k]) if worked[k] else None}
                       for k in np.nonzero(counts)[0]]
    typical = duration[working] if working.any() else duration
    threshold = slow_ms if slow_ms is not None else max(SLOW_FLOOR_MS, SLOW_FACTOR * float(np.median(typical)) / 1e6)
    view["slow_ms"] = round(threshold, 3)
    order = np.argsort(-duration, kind="stable")
    over = int(np.count_nonzero(duration >= threshold * 1e6))
    keep = order[:max(min(over, MAX_SLOW), min(SLOW_TOP, len(order)))]
    view["slow_steps"] = [_step_row(rows, int(picked[j]), threshold) for j in keep]
    _add_gc_ms(view["slow_steps"], rows.gc)
    return view


def _bucket_medians(bucket: np.ndarray, duration: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per bucket, the median of its durations (0 where it has none): one sort by (bucket, duration)."""
    out = np.zeros(len(counts), np.float64)
    if not len(bucket):
        return out
    order = np.lexsort((duration, bucket))
    ordered = duration[order]
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    lo = (first + (counts - 1) // 2)[has]
    hi = (first + counts // 2)[has]
    out[has] = (ordered[lo] + ordered[hi]) / 2
    return out


def _step_row(rows: Any, i: int, threshold_ms: float) -> dict:
    """Step ``i`` with every column its process sends (a newer probe's too); an unknown count is null."""
    row: dict[str, Any] = {}
    for name, values in rows.steps.items():
        value = values[i]
        row[name] = None if name not in _TIMES and isinstance(value, int) and value < 0 else value
    row["working"] = bool(row.get("working", True))
    duration = row["end_ns"] - row["start_ns"]
    row["duration_ms"] = _ms(duration)
    row["over"] = duration >= threshold_ms * 1e6
    return row


def _add_gc_ms(steps: list[dict], gc: dict) -> None:
    """Each step's time inside GC pauses of its process, on any thread (recorder_view.py says why)."""
    if not steps:
        return
    if not gc.get("start_ns"):
        for row in steps:
            row["gc_ms"] = 0.0 if "start_ns" in gc else None
        return
    g_start = _ints(gc["start_ns"])
    g_end = g_start + _ints(gc["duration_ns"])
    for row in steps:
        overlap = np.minimum(g_end, row["end_ns"]) - np.maximum(g_start, row["start_ns"])
        row["gc_ms"] = _ms(int(overlap[overlap > 0].sum()))


def _gc_marks(gc: dict, since_ns: int, until_ns: int, gc_ms: float) -> list[dict]:
    if not gc.get("start_ns"):
        return []
    start, duration = _ints(gc["start_ns"]), _ints(gc["duration_ns"])
    picked = np.nonzero((start + duration >= since_ns) & (start <= until_ns) & (duration >= gc_ms * 1e6))[0]
    if len(picked) > MAX_GC_MARKS:
        picked = np.sort(picked[np.argsort(-duration[picked], kind="stable")[:MAX_GC_MARKS]])
    generation = gc.get("generation")
    thread = gc.get("step_thread")
    return [{"start_ns": int(start[i]), "duration_ms": _ms(duration[i]),
             "generation": int(generation[i]) if generation is not None else None,
             "step_thread": bool(thread[i]) if thread is not None else None} for i in picked]


def _requests(processes: Sequence[Any], since_ns: int, until_ns: int, points: int, bucket_ns: int) -> dict:
    ttft: dict[int, list[float]] = {}
    e2e: dict[int, list[float]] = {}
    finished = 0
    for rows in processes:
        for _, arrived, first, done, _, _, _ in rows.requests:
            if done < since_ns or done > until_ns:
                continue
            finished += 1
            k = min(points - 1, max(0, (done - since_ns) // bucket_ns))
            e2e.setdefault(k, []).append((done - arrived) / 1e6)
            if first is not None and first > 0:
                ttft.setdefault(k, []).append((first - arrived) / 1e6)
    buckets = []
    for k in sorted(e2e):
        t = ttft.get(k, [])
        buckets.append({"start_ns": since_ns + k * bucket_ns, "count": len(e2e[k]),
                        "ttft_max_ms": round(max(t), 3) if t else None,
                        "ttft_median_ms": round(statistics.median(t), 3) if t else None,
                        "e2e_max_ms": round(max(e2e[k]), 3), "e2e_median_ms": round(statistics.median(e2e[k]), 3)})
    return {"finished": finished, "buckets": buckets}


def _known(value: Any) -> Any:
    return None if value is None or (isinstance(value, int) and value < 0) else value


def _in_flight(processes: Sequence[Any], until_ns: int) -> dict:
    """Every process's requests in flight, one row per id (data-parallel engines: each is in one), oldest first."""
    rows: dict[str, dict] = {}
    for view in processes:
        for r in view.in_flight:
            arrived = r.get("arrived_ns")
            if not isinstance(arrived, int) or arrived <= 0:
                continue
            rows.setdefault(str(r.get("id")), {
                "id": str(r.get("id")), "process": view.process.get("label"), "arrived_ns": arrived,
                "age_ms": _ms(max(0, until_ns - arrived)), "phase": r.get("phase"),
                "prompt_tokens": _known(r.get("prompt_tokens")), "output_tokens": _known(r.get("output_tokens"))})
    listed = sorted(rows.values(), key=lambda r: r["arrived_ns"])
    return {"count": len(listed), "requests": listed[:MAX_IN_FLIGHT]}


def _stuck(report: dict) -> dict:
    frames = [{"function": f.get("function"), "file": f.get("file"), "line": f.get("line")}
              for f in reversed((report.get("frames") or [])[-MAX_STUCK_FRAMES:])]  # innermost first
    return {"process": report.get("process"), "step": report.get("step"), "since_ns": report.get("since_ns"),
            "age_s": report.get("age_s"), "threshold_s": report.get("threshold_s"), "frames": frames}


def _capture_marks(captures: Iterable[dict], since_ns: int, until_ns: int) -> list[dict]:
    marks = []
    for c in captures:
        start = int((c.get("created_at") or 0) * 1e9)
        end = int(c["finished_at"] * 1e9) if c.get("finished_at") else None
        if start and start <= until_ns and (end is None or end >= since_ns):
            marks.append({"id": c.get("id"), "state": c.get("state"), "start_ns": start, "end_ns": end})
    return sorted(marks, key=lambda m: m["start_ns"])[-MAX_MARKS:]


def _firing_marks(firings: Iterable[dict], since_ns: int, until_ns: int) -> list[dict]:
    marks = []
    for f in firings:
        at = int((f.get("at") or 0) * 1e9)
        if since_ns <= at <= until_ns:
            marks.append({"at_ns": at, "trigger": f.get("trigger"), "name": f.get("name"),
                          "outcome": f.get("outcome"), "metric": f.get("metric"),
                          "observed_ms": f.get("observed_ms"), "threshold_ms": f.get("threshold_ms"),
                          "capture": f.get("capture")})
    return sorted(marks, key=lambda m: m["at_ns"])[-MAX_MARKS:]
