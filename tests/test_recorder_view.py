"""The flight recorder's answer (sidecar/service/incidents/recorder_view.py): processes' dumps merged into rows, GC
time attributed to steps, the window applied, and the Chrome trace read back by the project's own
trace reader."""

from __future__ import annotations

import json
from typing import Any

from sidecar.analysis.reader.stream import TopLevel, read_events
from sidecar.analysis.summary import load
from sidecar.probe.flight_ring import GcPauses, RequestRing, StepRing
from sidecar.service.incidents.recorder_view import GC_TID, REQUESTS_TID, STEPS_TID, SYNTHETIC_PID_BASE, merge, to_chrome_trace

MS = 1_000_000  # ns
T0 = 1_790_000_000_000_000_000  # a Unix time in ns


def core_process(pid: int = 200) -> dict:
    return {"role": "engine_core", "pid": pid, "rank": None, "label": f"engine core (pid {pid})", "host": "h"}


def steps_dump(rows: list[tuple], open_since_ns: int = 0, capacity: int = 65536) -> dict:
    """rows: (step, start_ns, end_ns, working, batch, tokens, prefill, decode, running, waiting)."""
    names = ("step", "start_ns", "end_ns", "working", "batch", "tokens", "prefill_tokens", "decode_tokens",
             "running", "waiting")
    return {"clock": "unix_ns", "capacity": capacity, "written": 1000 + len(rows), "open_since_ns": open_since_ns,
            "steps": {name: [row[k] for row in rows] for k, name in enumerate(names)}}


def gc_dump(rows: list[tuple], collections: int = 100) -> dict:
    """rows: (start_ns, duration_ns, generation, collected, step_thread); the totals of GcPauses.dump."""
    names = ("start_ns", "duration_ns", "generation", "collected", "step_thread")
    return {**{name: [row[k] for row in rows] for k, name in enumerate(names)}, "min_pause_ns": MS // 2,
            "collections": collections, "pause_ns": 75 * MS, "step_thread_pause_ns": 50 * MS}


def requests_dump(rows: list[tuple]) -> dict:
    names = ("id", "arrived_ns", "first_token_ns", "finished_ns", "outcome", "prompt_tokens", "output_tokens")
    return {name: [row[k] for row in rows] for k, name in enumerate(names)}


def two_processes() -> list[tuple[dict, Any, Any]]:
    core = {
        "steps": steps_dump([
            (1, T0, T0 + 10 * MS, 1, 4, 64, 32, 32, 4, 0),
            (2, T0 + 10 * MS, T0 + 30 * MS, 1, 4, 4, -1, -1, 4, 1),  # 20 ms, the slowest
            (3, T0 + 31 * MS, T0 + 32 * MS, 0, 0, 0, 0, 0, 0, 0),
        ], open_since_ns=T0 + 40 * MS),
        "gc": gc_dump([
            (T0 + 5 * MS, 2 * MS, 0, 10, 1),    # inside step 1: 2 ms
            (T0 + 29 * MS, 3 * MS, 2, 500, 1),  # 1 ms in step 2, 1 ms idle gap, 1 ms in step 3
            (T0 + 12 * MS, 4 * MS, 1, 7, 0),    # another thread, inside step 2: it holds the GIL too
        ]),
    }
    api = {
        "gc": gc_dump([]),
        "requests": requests_dump([
            ("req-a", T0 - 5 * MS, T0 + 1 * MS, T0 + 20 * MS, "finished", 12, 30),
            ("req-b", T0 + 2 * MS, -1, T0 + 3 * MS, "aborted", 5, 0),
        ]),
        "in_flight": [{"id": "req-c", "arrived_ns": T0 + 25 * MS, "phase": "decode", "prompt_tokens": 9,
                       "output_tokens": -1}],
    }
    worker = {"role": "worker", "pid": 300, "rank": 0, "label": "worker rank 0 (pid 300)", "host": "h"}
    return [(core_process(), core, None),
            ({"role": "api_server", "pid": 100, "rank": None, "label": "API server (pid 100)", "host": "h"}, api, None),
            (worker, None, "timed out after 2 s")]


WINDOW = (T0 - 100 * MS, T0 + 50 * MS)


def test_merge_gives_rows_per_process_with_nulls_for_the_unknown_and_the_error_of_a_silent_process():
    merged = merge(two_processes(), *WINDOW)
    assert merged["clock"] == "unix_ns" and (merged["since_ns"], merged["until_ns"]) == WINDOW
    core, api, worker = merged["processes"]
    assert core["process"]["pid"] == 200 and core["error"] is None
    assert core["capacity"] == 65536 and core["steps_written"] == 1003
    assert [s["step"] for s in core["steps"]] == [1, 2, 3]
    second = core["steps"][1]
    assert second == {"step": 2, "start_ns": T0 + 10 * MS, "end_ns": T0 + 30 * MS, "duration_ms": 20.0,
                      "working": True, "batch": 4, "tokens": 4, "prefill_tokens": None, "decode_tokens": None,
                      "running": 4, "waiting": 1, "gc_ms": 5.0}
    assert core["steps"][2]["working"] is False
    assert core["open_step"] == {"since_ns": T0 + 40 * MS, "age_ms": 10.0}
    assert [g["generation"] for g in core["gc"]] == [0, 2, 1]
    assert core["gc"][1] == {"start_ns": T0 + 29 * MS, "duration_ms": 3.0, "generation": 2, "collected": 500,
                             "step_thread": True}
    assert core["gc_totals"] == {"collections": 100, "pause_ms": 75.0, "step_thread_pause_ms": 50.0,
                                 "min_pause_ms": 0.5}
    assert core["requests"] == [] and core["in_flight"] == []

    assert api["capacity"] is None and api["steps"] == [] and api["open_step"] is None
    assert api["requests"] == [
        {"id": "req-a", "arrived_ns": T0 - 5 * MS, "first_token_ns": T0 + 1 * MS, "finished_ns": T0 + 20 * MS,
         "outcome": "finished", "prompt_tokens": 12, "output_tokens": 30, "ttft_ms": 6.0, "e2e_ms": 25.0},
        {"id": "req-b", "arrived_ns": T0 + 2 * MS, "first_token_ns": None, "finished_ns": T0 + 3 * MS,
         "outcome": "aborted", "prompt_tokens": 5, "output_tokens": 0, "ttft_ms": None, "e2e_ms": 1.0},
    ]
    assert api["in_flight"] == [{"id": "req-c", "arrived_ns": T0 + 25 * MS, "phase": "decode",
                                 "prompt_tokens": 9, "output_tokens": None, "age_ms": 25.0}]

    assert worker["error"] == "timed out after 2 s"
    assert worker["steps"] == worker["gc"] == worker["requests"] == worker["in_flight"] == []
    assert worker["open_step"] is None and worker["capacity"] is None and worker["gc_totals"] is None

    assert merged["summary"] == {
        "steps": 3, "slowest_step_ms": 20.0,
        "slowest_step": {"label": "engine core (pid 200)", "pid": 200, "step": 2, "start_ns": T0 + 10 * MS},
        "gc_pause_ms_total": 9.0, "requests_finished": 2, "requests_in_flight": 1}
    json.dumps(merged)


def test_gc_time_is_attributed_to_the_steps_it_overlaps_whatever_thread_collected():
    core = merge(two_processes(), *WINDOW)["processes"][0]
    # step 1: the 2 ms pause; step 2: the 4 ms pause of another thread (the collector holds the GIL)
    # and the first 1 ms of the 29-32 ms pause; step 3: its 31-32 ms; the idle gap counts nowhere.
    assert [s["gc_ms"] for s in core["steps"]] == [2.0, 5.0, 1.0]


def test_a_process_that_sent_no_gc_data_has_null_gc_time_not_zero():
    dump = {"steps": steps_dump([(1, T0, T0 + MS, 1, -1, -1, -1, -1, -1, -1)])}
    (view,) = merge([(core_process(), dump, None)], *WINDOW)["processes"]
    assert view["steps"][0]["gc_ms"] is None and view["gc"] == [] and view["gc_totals"] is None


def test_rows_outside_the_window_are_dropped_and_rows_across_its_edges_kept():
    since, until = T0 + 9 * MS, T0 + 12 * MS
    merged = merge(two_processes(), since, until)
    core, api, _ = merged["processes"]
    assert [s["step"] for s in core["steps"]] == [1, 2]  # 1 ends at 10 ms, 2 starts at 10 ms; 3 starts at 31
    assert [g["start_ns"] for g in core["gc"]] == [T0 + 12 * MS]  # the pause starting at until: kept
    assert core["open_step"] is None  # begun at 40 ms, after until
    assert [r["id"] for r in api["requests"]] == ["req-a"]  # req-b finished at 3 ms, before since
    assert api["in_flight"] == []  # arrived at 25 ms, after until
    assert merged["summary"]["steps"] == 2 and merged["summary"]["requests_in_flight"] == 0


def test_merge_of_nothing_is_an_empty_answer():
    merged = merge([], 0, 1)
    assert merged["processes"] == []
    assert merged["summary"] == {"steps": 0, "slowest_step_ms": None, "slowest_step": None,
                                 "gc_pause_ms_total": 0.0, "requests_finished": 0, "requests_in_flight": 0}


def test_real_ring_dumps_merge():
    """The rings' own dumps, not hand-made ones, go through merge."""
    ring, requests = StepRing(8), RequestRing(8)
    pauses = GcPauses(8, step_thread_id=lambda: ring.step_thread_id, min_pause_ns=0)
    for step in range(3):
        ring.begin()
        ring.end(step, True, batch=2, tokens=16)
    pauses._on_gc("start", {})
    pauses._on_gc("stop", {"generation": 0, "collected": 3})
    requests.add("r1", ring.dump()["steps"]["start_ns"][0], -1, ring.dump()["steps"]["end_ns"][-1], "error", 4, 0)
    ring.begin()
    dump = {"steps": ring.dump(), "gc": pauses.dump(), "requests": requests.dump()}
    start = dump["steps"]["steps"]["start_ns"][0]
    (view,) = merge([(core_process(), dump, None)], start, start + 10**12)["processes"]
    assert [s["step"] for s in view["steps"]] == [0, 1, 2]
    assert all(s["batch"] == 2 and s["tokens"] == 16 and s["running"] is None for s in view["steps"])
    assert view["open_step"]["since_ns"] == ring.open_since_ns
    assert len(view["gc"]) == 1 and view["gc"][0]["step_thread"] is True  # this thread began the steps
    assert view["requests"][0]["outcome"] == "error" and view["requests"][0]["ttft_ms"] is None


# -- the Chrome trace --------------------------------------------------------------------------------
def trace_of(answers=None) -> dict:
    return to_chrome_trace(merge(answers or two_processes(), *WINDOW))


def test_the_trace_has_a_named_track_per_process_and_a_named_thread_per_kind_of_row():
    trace = trace_of()
    assert trace["displayTimeUnit"] == "ms"
    assert trace["otherData"]["since_ns"] == WINDOW[0] and trace["otherData"]["summary"]["steps"] == 3
    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    names = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert names == {200: "engine core (pid 200)", 100: "API server (pid 100)", 300: "worker rank 0 (pid 300)"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads == {(200, STEPS_TID): "steps", (200, GC_TID): "gc", (100, REQUESTS_TID): "requests"}
    order = {e["pid"]: e["args"]["sort_index"] for e in meta if e["name"] == "process_sort_index"}
    assert order == {200: 0, 100: 1, 300: 2}


def test_steps_gc_and_the_open_step_are_complete_slices_in_absolute_unix_microseconds():
    events = trace_of()["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert all({"ts", "dur", "pid", "tid", "name"} <= e.keys() for e in slices)
    steps = [e for e in slices if e["tid"] == STEPS_TID]
    assert [e["name"] for e in steps] == ["step 1", "step 2", "idle", "step (still running)"]
    second = steps[1]
    assert second["ts"] == (T0 + 10 * MS) / 1000 and second["dur"] == 20_000
    assert second["args"] == {"step": 2, "batch": 4, "tokens": 4, "running": 4, "waiting": 1, "gc_ms": 5.0}
    assert steps[3]["ts"] == (T0 + 40 * MS) / 1000 and steps[3]["dur"] == 10_000  # up to until_ns
    gcs = [e for e in slices if e["tid"] == GC_TID]
    assert [e["name"] for e in gcs] == ["gc (generation 0)", "gc (generation 1)", "gc (generation 2)"]
    assert [e["dur"] for e in gcs] == [2000, 4000, 3000]
    assert all(e["pid"] == 200 for e in steps + gcs)


def test_requests_are_async_slices_with_a_first_token_instant_and_in_flight_ones_end_at_until():
    events = [e for e in trace_of()["traceEvents"] if e.get("cat") == "request"]
    assert all(e["pid"] == 100 and e["tid"] == REQUESTS_TID for e in events)
    by_id: dict[str, list] = {}
    for e in events:
        by_id.setdefault(e["id"], []).append((e["ph"], e["name"], e["ts"]))
    assert by_id["req-a"] == [("b", "request", (T0 - 5 * MS) / 1000), ("n", "first token", (T0 + MS) / 1000),
                              ("e", "request", (T0 + 20 * MS) / 1000)]
    assert by_id["req-b"] == [("b", "request", (T0 + 2 * MS) / 1000), ("e", "request", (T0 + 3 * MS) / 1000)]
    assert by_id["req-c"] == [("b", "request", (T0 + 25 * MS) / 1000), ("e", "request", WINDOW[1] / 1000)]
    begin_c = next(e for e in events if e["id"] == "req-c" and e["ph"] == "b")
    assert begin_c["args"] == {"in_flight": True, "phase": "decode", "prompt_tokens": 9, "age_ms": 25.0}
    begin_a = next(e for e in events if e["id"] == "req-a" and e["ph"] == "b")
    assert begin_a["args"] == {"outcome": "finished", "prompt_tokens": 12, "output_tokens": 30, "ttft_ms": 6.0,
                               "e2e_ms": 25.0}


def test_the_trace_is_in_time_order_after_its_metadata():
    events = trace_of()["traceEvents"]
    kinds = [e["ph"] == "M" for e in events]
    assert kinds == sorted(kinds, reverse=True)  # all metadata first
    stamps = [e["ts"] for e in events if e["ph"] != "M"]
    assert stamps == sorted(stamps)
    assert len(events) == 9 + 4 + 3 + 7  # metadata, steps + open step, gc, request events


def test_processes_sharing_a_pid_get_tracks_of_their_own():
    answers = [(core_process(7), {"steps": steps_dump([(1, T0, T0 + MS, 1, 1, 1, 1, 1, 1, 1)])}, None),
               ({**core_process(7), "host": "other"}, {"steps": steps_dump([(1, T0, T0 + MS, 1, 1, 1, 1, 1, 1, 1)])},
                None),
               ({"role": "worker", "label": "no pid"}, None, "lost")]
    names = {e["pid"]: e["args"]["name"] for e in trace_of(answers)["traceEvents"] if e["name"] == "process_name"}
    assert names == {7: "engine core (pid 7)", SYNTHETIC_PID_BASE + 1: "engine core (pid 7)",
                     SYNTHETIC_PID_BASE + 2: "no pid"}


def test_the_projects_trace_reader_reads_the_trace_whole(tmp_path):
    path = tmp_path / "recorder.json"
    trace = trace_of()
    path.write_text(json.dumps(trace))
    top = TopLevel()
    read = [e for batch in read_events(str(path), top) for e in batch]
    assert len(read) == len(trace["traceEvents"]) and top.skipped_events == 0
    assert top.members["displayTimeUnit"] == "ms"
    data = load(path)
    assert data.process_names == {200: "engine core (pid 200)", 100: "API server (pid 100)",
                                  300: "worker rank 0 (pid 300)"}
    assert data.skipped_count == 0


def test_the_trace_is_strict_json():
    json.loads(json.dumps(trace_of(), allow_nan=False))
