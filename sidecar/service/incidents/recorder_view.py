"""The flight recorder as the sidecar answers it: several processes' dumps merged into rows, and the
same as a Chrome/Perfetto trace.

Each process's probe dumps its rings as columns (sidecar/probe/flight_ring.py): compact on the wire and
cheap in the engine process. People and ``jq`` want rows, one object per step, pause or request,
with durations in milliseconds and ``null`` for what the process does not know; that is built here,
in the sidecar, never in an engine process.

``merge`` answers (stable; every time is Unix nanoseconds, ``time.time_ns()``, every ``*_ms`` is
milliseconds rounded to the microsecond)::

    {"clock": "unix_ns", "since_ns": ..., "until_ns": ...,
     "processes": [
       {"process": {...as the sidecar lists it...}, "error": null or "why nothing came",
        "clock_correction_ms": what was subtracted from its times to put them on the sidecar's clock
                               (its measured offset where that exceeds the uncertainty: another host; else 0),
        "capacity": rows of its step ring or null, "steps_written": steps ever recorded or null,
        "gpu_memory_source": "step_end" | "sampled" | "pending" (a process with CUDA) or null,
        "steps": [{"step", "start_ns", "end_ns", "duration_ms", "working": bool, "batch", "tokens",
                   "prefill_tokens", "decode_tokens", "running", "waiting",
                   "gpu_allocated", "gpu_reserved": the CUDA allocator's bytes at the step's end
                            (a process with CUDA only; null while not known),
                   "gc_ms": time of the GC pauses in "gc" inside this step, on any thread of the
                            process: a collection holds the GIL, so one on another thread
                            stops the step thread's Python too (null: no GC data)}],
        "open_step": {"since_ns", "age_ms"} or null,     # a step begun and not ended at until_ns
        "gc": [{"start_ns", "duration_ms", "generation", "collected", "step_thread": bool}],
        "gc_totals": {"collections", "pause_ms", "step_thread_pause_ms", "min_pause_ms"} or null,
        "requests": [{"id", "arrived_ns", "first_token_ns", "finished_ns", "outcome", "prompt_tokens",
                      "output_tokens", "ttft_ms", "e2e_ms"}],
        "in_flight": [{"id", "arrived_ns", "phase", "prompt_tokens", "output_tokens", "age_ms"}]}],
     "summary": {"steps": N, "slowest_step_ms": ms or null,
                 "slowest_step": {"label", "pid", "step", "start_ns"} or null,
                 "gc_pause_ms_total": ms, "requests_finished": N, "requests_in_flight": N}}

A row is kept when its interval meets ``[since_ns, until_ns]``: a step or a GC pause that ends at or
after ``since_ns`` and starts at or before ``until_ns``; a request that finished at or after
``since_ns`` and arrived at or before ``until_ns``; an in-flight request that arrived at or before
``until_ns``. Rows are in each process's recording order. A count a process does not know (-1 in
its dump) is ``null``. A process keeps a GC pause as a row only from ``min_pause_ms`` on
(flight_ring.GcPauses), so ``gc_ms`` and ``gc_pause_ms_total`` count those; ``gc_totals`` counts
every collection since the process started, whatever the window.

``to_chrome_trace`` (open it in ui.perfetto.dev or chrome://tracing): one process track per process,
named by its label; steps as complete slices "step <n>" ("idle" when the step did no work) on a
thread "steps" (with CUDA, a counter "gpu memory (bytes)" of the allocator's bytes at each step's end), GC pauses on a thread "gc", the open step as "step (still running)" up to
``until_ns``; requests as async slices "request" (category "request", id = the request id) with an
instant "first token", in-flight requests as async slices up to ``until_ns``. ``ts`` is **absolute
Unix microseconds** (``ns / 1000``), not relative to the window, so traces of different calls (and
the recorder's beside a capture's, after its ``baseTimeNanoseconds``) line up; at today's Unix times
a double resolves such a ``ts`` to about 0.25 µs.
"""

from __future__ import annotations

from bisect import bisect_right
from types import MappingProxyType
from typing import Any, Iterable, Iterator, Optional

from ...common.recorder_fields import GC_FIELDS, GPU_MEMORY_FIELDS, STEP_FIELDS

STEP_COUNTS = ("batch", "tokens", "prefill_tokens", "decode_tokens", "running", "waiting")
_START, _END = STEP_FIELDS.index("start_ns"), STEP_FIELDS.index("end_ns")

# Trace layout: thread ids inside each process track.
STEPS_TID = 1
GC_TID = 2
REQUESTS_TID = 3
TRACK_NAMES = MappingProxyType({STEPS_TID: "steps", GC_TID: "gc", REQUESTS_TID: "requests"})
# pids for processes whose own pid is missing or taken (two hosts): above any Linux pid (2**22).
SYNTHETIC_PID_BASE = 1 << 30


def _ms(ns: float) -> float:
    return round(ns / 1e6, 3)


def _known(value: Any) -> Any:
    """A count as rows show it: ``None`` for an unknown (negative) or missing one."""
    return None if value is None or value < 0 else value


def _rows(columns: Optional[dict[str, Any]], names: Optional[Iterable[str]] = None) -> list[dict[str, Any]]:
    """Columns (a dump) → one dict per row; ``names``: the columns to take (default: all)."""
    if not columns:
        return []
    names = list(columns if names is None else names)
    return [dict(zip(names, values)) for values in zip(*(columns[name] for name in names))]


# -- merge ---------------------------------------------------------------------------------------
def merge(answers: list[tuple[dict, Optional[dict], Optional[str]]], since_ns: int, until_ns: int) -> dict:
    """The recorder's answer from each process's (process JSON, recorder dump or None, error or None)
    (module docstring)."""
    processes = [_process_view(process, dump or {}, error, since_ns, until_ns)
                 for process, dump, error in answers]
    return {"clock": "unix_ns", "since_ns": since_ns, "until_ns": until_ns, "processes": processes,
            "summary": _summary(processes)}


def _process_view(process: dict, dump: dict, error: Optional[str], since_ns: int, until_ns: int) -> dict:
    steps_dump = dump.get("steps") or {}
    gc_dump = dump.get("gc")
    gc_all = _rows(gc_dump, GC_FIELDS)
    steps = _step_rows(steps_dump.get("steps"), gc_all if "gc" in dump else None, since_ns, until_ns)
    open_since = steps_dump.get("open_since_ns") or 0
    open_step = ({"since_ns": open_since, "age_ms": _ms(until_ns - open_since)}
                 if 0 < open_since <= until_ns else None)
    gc_rows = [{"start_ns": g["start_ns"], "duration_ms": _ms(g["duration_ns"]), "generation": g["generation"],
                "collected": _known(g["collected"]), "step_thread": bool(g["step_thread"])}
               for g in gc_all if g["start_ns"] + g["duration_ns"] >= since_ns and g["start_ns"] <= until_ns]
    return {"process": process, "error": error,
            # service/recorder_clock.py moved the dump's times already; this says by how much.
            "clock_correction_ms": _ms(dump.get("clock_correction_ns") or 0),
            "capacity": steps_dump.get("capacity"),
            # A process with CUDA: how its steps' gpu_allocated / gpu_reserved were read (step_end,
            # sampled, pending: sidecar/probe/gpu_memory.py); null without CUDA (no such columns).
            "gpu_memory_source": steps_dump.get("gpu_memory_source"),
            "steps_written": steps_dump.get("written"), "steps": steps, "open_step": open_step,
            "gc": gc_rows, "gc_totals": _gc_totals(gc_dump),
            "requests": _request_rows(dump.get("requests"), since_ns, until_ns),
            "in_flight": _in_flight_rows(dump.get("in_flight"), until_ns)}


def _gc_totals(gc_dump: Optional[dict]) -> Optional[dict]:
    if not gc_dump or "collections" not in gc_dump:
        return None
    return {"collections": gc_dump["collections"], "pause_ms": _ms(gc_dump["pause_ns"]),
            "step_thread_pause_ms": _ms(gc_dump["step_thread_pause_ns"]),
            "min_pause_ms": _ms(gc_dump["min_pause_ns"])}


def _step_rows(columns: Optional[dict], gc_all: Optional[list[dict]], since_ns: int, until_ns: int) -> list[dict]:
    if not columns:
        return []
    # Straight from the columns, window first: a full ring is 65,536 rows per process.
    fields = STEP_FIELDS + tuple(name for name in GPU_MEMORY_FIELDS if name in columns)
    rows = [dict(zip(fields, values)) for values in zip(*(columns[name] for name in fields))
            if values[_END] >= since_ns and values[_START] <= until_ns]
    gpu = fields[len(STEP_FIELDS):]
    gc_ns = _gc_ns_per_step(rows, gc_all) if gc_all is not None else None
    for j, row in enumerate(rows):
        row["duration_ms"] = _ms(row["end_ns"] - row["start_ns"])
        row["working"] = bool(row["working"])
        for name in STEP_COUNTS + gpu:
            if row[name] < 0:
                row[name] = None
        row["gc_ms"] = _ms(gc_ns[j]) if gc_ns is not None else None
    return rows


def _gc_ns_per_step(steps: list[dict], pauses: list[dict]) -> list[int]:
    """Per step (same order as ``steps``), the nanoseconds of GC pauses inside it, whatever thread ran
    them: the collector holds the GIL for the whole pause, so the step thread waits for one that runs
    on another thread (the probe's, an exporter's) as soon as it needs to run Python.

    Steps of one process run one after another on one thread, so sorted by start they do not
    overlap, and a pause meets the step that starts at or before it and the next ones up to its
    end (a pause can span an idle gap and two steps)."""
    total = [0] * len(steps)
    order = sorted(range(len(steps)), key=lambda j: steps[j]["start_ns"])
    starts = [steps[j]["start_ns"] for j in order]
    for pause in pauses:
        p_start = pause["start_ns"]
        p_end = p_start + pause["duration_ns"]
        k = max(0, bisect_right(starts, p_start) - 1)
        while k < len(order) and starts[k] < p_end:
            j = order[k]
            overlap = min(p_end, steps[j]["end_ns"]) - max(p_start, starts[k])
            if overlap > 0:
                total[j] += overlap
            k += 1
    return total


def _request_rows(columns: Optional[dict], since_ns: int, until_ns: int) -> list[dict]:
    out = []
    for r in _rows(columns):
        arrived, first, finished = r["arrived_ns"], _known(r["first_token_ns"]), r["finished_ns"]
        if finished < since_ns or arrived > until_ns:
            continue
        out.append({"id": r["id"], "arrived_ns": arrived, "first_token_ns": first, "finished_ns": finished,
                    "outcome": r["outcome"], "prompt_tokens": _known(r["prompt_tokens"]),
                    "output_tokens": _known(r["output_tokens"]),
                    "ttft_ms": _ms(first - arrived) if first is not None else None,
                    "e2e_ms": _ms(finished - arrived)})
    return out


def _in_flight_rows(entries: Optional[list[dict]], until_ns: int) -> list[dict]:
    return [{"id": r["id"], "arrived_ns": r["arrived_ns"], "phase": r.get("phase"),
             "prompt_tokens": _known(r.get("prompt_tokens")), "output_tokens": _known(r.get("output_tokens")),
             "age_ms": _ms(until_ns - r["arrived_ns"])}
            for r in entries or () if r["arrived_ns"] <= until_ns]


def _summary(processes: list[dict]) -> dict:
    slowest: Optional[dict] = None
    slowest_process: Optional[dict] = None
    steps = requests = in_flight = 0
    gc_ms = 0.0
    for view in processes:
        steps += len(view["steps"])
        requests += len(view["requests"])
        in_flight += len(view["in_flight"])
        gc_ms += sum(g["duration_ms"] for g in view["gc"])
        for row in view["steps"]:
            if slowest is None or row["duration_ms"] > slowest["duration_ms"]:
                slowest, slowest_process = row, view["process"]
    where = None
    if slowest is not None:
        where = {"label": slowest_process.get("label"), "pid": slowest_process.get("pid"),
                 "step": slowest["step"], "start_ns": slowest["start_ns"]}
    return {"steps": steps, "slowest_step_ms": slowest["duration_ms"] if slowest else None,
            "slowest_step": where, "gc_pause_ms_total": round(gc_ms, 3), "requests_finished": requests,
            "requests_in_flight": in_flight}


# -- Chrome trace ----------------------------------------------------------------------------------
def to_chrome_trace(merged: dict) -> dict:
    """``merge``'s answer as Chrome trace-event JSON (module docstring)."""
    until_ns = merged["until_ns"]
    metadata: list[dict] = []
    timed: list[dict] = []
    for index, (view, pid) in enumerate(zip(merged["processes"], _trace_pids(merged["processes"]))):
        own = list(_process_events(view, pid, until_ns))
        process = view["process"]
        label = process.get("label") or f"{process.get('role', 'process')} (pid {process.get('pid')})"
        metadata.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
        metadata.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                         "args": {"sort_index": index}})
        for tid in sorted({event["tid"] for event in own}):
            metadata.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                             "args": {"name": TRACK_NAMES[tid]}})
        timed.extend(own)
    timed.sort(key=lambda event: event["ts"])  # stable: a request's b stays before its n and e at one ts
    return {"traceEvents": metadata + timed, "displayTimeUnit": "ms",
            "otherData": {"source": "inference-sidecar flight recorder",
                          "clock": "ts and dur in Unix microseconds (unix ns / 1000)",
                          "since_ns": merged["since_ns"], "until_ns": until_ns, "summary": merged["summary"]}}


def _trace_pids(processes: list[dict]) -> list[int]:
    """Each process's own pid, unless it is missing or another process has it (processes on two
    hosts): then a synthetic one, so that no two processes share a track."""
    out: list[int] = []
    for index, view in enumerate(processes):
        pid = view["process"].get("pid")
        out.append(pid if isinstance(pid, int) and pid > 0 and pid not in out else SYNTHETIC_PID_BASE + index)
    return out


def _us(ns: int) -> float:
    return ns / 1000


def _args(row: dict, names: tuple[str, ...]) -> dict:
    return {name: row[name] for name in names if row.get(name) is not None}


def _process_events(view: dict, pid: int, until_ns: int) -> Iterator[dict]:
    for s in view["steps"]:
        yield {"ph": "X", "cat": "step", "name": f"step {s['step']}" if s["working"] else "idle", "pid": pid,
               "tid": STEPS_TID, "ts": _us(s["start_ns"]), "dur": _us(s["end_ns"] - s["start_ns"]),
               "args": _args(s, ("step", *STEP_COUNTS, "gc_ms", *GPU_MEMORY_FIELDS))}
        if s.get("gpu_allocated") is not None:  # a process with CUDA: the allocator's bytes as a counter track
            yield {"ph": "C", "name": "gpu memory (bytes)", "pid": pid, "tid": STEPS_TID, "ts": _us(s["end_ns"]),
                   "args": {"allocated": s["gpu_allocated"], "reserved": s["gpu_reserved"]}}
    open_step = view["open_step"]
    if open_step is not None:
        yield {"ph": "X", "cat": "step", "name": "step (still running)", "pid": pid, "tid": STEPS_TID,
               "ts": _us(open_step["since_ns"]), "dur": _us(until_ns - open_step["since_ns"]),
               "args": {"age_ms": open_step["age_ms"]}}
    for g in view["gc"]:
        yield {"ph": "X", "cat": "gc", "name": f"gc (generation {g['generation']})", "pid": pid, "tid": GC_TID,
               "ts": _us(g["start_ns"]), "dur": round(g["duration_ms"] * 1000, 3),
               "args": _args(g, ("generation", "collected", "step_thread"))}
    for r in view["requests"]:
        common = {"cat": "request", "id": str(r["id"]), "pid": pid, "tid": REQUESTS_TID}
        yield {"ph": "b", "name": "request", "ts": _us(r["arrived_ns"]), **common,
               "args": _args(r, ("outcome", "prompt_tokens", "output_tokens", "ttft_ms", "e2e_ms"))}
        if r["first_token_ns"] is not None:
            yield {"ph": "n", "name": "first token", "ts": _us(r["first_token_ns"]), **common}
        yield {"ph": "e", "name": "request", "ts": _us(r["finished_ns"]), **common}
    for r in view["in_flight"]:
        common = {"cat": "request", "id": str(r["id"]), "pid": pid, "tid": REQUESTS_TID}
        yield {"ph": "b", "name": "request", "ts": _us(r["arrived_ns"]), **common,
               "args": {"in_flight": True, **_args(r, ("phase", "prompt_tokens", "output_tokens", "age_ms"))}}
        yield {"ph": "e", "name": "request", "ts": _us(until_ns), **common}
