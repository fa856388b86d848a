"""The home page's timeline made from recorder rows (sidecar/service/incidents/recorder_timeline.py):
bounds, the bucket math, which slow steps are kept, GC pauses, requests, in-flight order and the marks;
and the sidecar's store of the window (recorder_window.py): rows added once across overlapping reads,
trimmed to the window and its bounds."""

from __future__ import annotations

import asyncio
import statistics
from array import array

import pytest

from sidecar.common.recorder_fields import STEP_FIELDS
from sidecar.service.incidents import recorder_timeline as tl
from sidecar.service.incidents import recorder_window as rw
from sidecar.service.incidents.recorder_window import ProcessRows

S = 1_000_000_000
MS = 1_000_000
T0 = 1_800_000_000 * S  # the window starts here


def steps_dump(rows: list[tuple], open_since_ns: int = 0) -> dict:
    """A probe's step ring dump of rows (step, start_ns, duration_ms, working) with fixed counts."""
    cols: dict[str, list] = {name: [] for name in STEP_FIELDS}
    for step, start, duration_ms, working in rows:
        values = (step, start, start + int(duration_ms * MS), working, 4, 16, 0, 4, -1, -1)
        for name, value in zip(STEP_FIELDS, values):
            cols[name].append(value)
    return {"capacity": 65536, "written": len(rows), "open_since_ns": open_since_ns, "steps": cols}


def process_rows(rows: list[tuple], *, gc=None, requests=(), in_flight=(), label="worker 0") -> ProcessRows:
    held = ProcessRows({"label": label, "role": "worker"})
    gc_cols = {"start_ns": [], "duration_ns": [], "generation": [], "collected": [], "step_thread": []}
    for start, duration_ms, gen in gc or ():
        for name, value in zip(gc_cols, (start, int(duration_ms * MS), gen, 10, 1)):
            gc_cols[name].append(value)
    req_cols = {n: [] for n in ("id", "arrived_ns", "first_token_ns", "finished_ns", "outcome", "prompt_tokens",
                               "output_tokens")}
    for row in requests:
        for name, value in zip(req_cols, row):
            req_cols[name].append(value)
    held.absorb({"steps": steps_dump(rows), "gc": gc_cols, "requests": req_cols, "in_flight": list(in_flight)},
                T0, T0 + 60 * S, whole=True)
    return held


def test_buckets_count_every_step_by_its_start_with_max_and_working_median():
    # 10 buckets of 6 s; bucket 0: steps of 1, 2, 3 ms and an idle 50 ms; bucket 5: 4 and 8 ms.
    rows = [(1, T0 + 1 * S, 1, 1), (2, T0 + 2 * S, 3, 1), (3, T0 + 3 * S, 2, 1), (4, T0 + 4 * S, 50, 0),
            (5, T0 + 31 * S, 4, 1), (6, T0 + 32 * S, 8, 1), (7, T0 - 1 * S, 1500, 1)]  # 7: began before, ends inside
    out = tl.build([process_rows(rows)], since_ns=T0, until_ns=T0 + 60 * S, points=10)
    assert out["bucket_ns"] == 6 * S and out["points"] == 10 and out["seconds"] == 60
    (view,) = out["processes"]
    assert view["steps"] == 7
    buckets = {(b["start_ns"] - T0) // (6 * S): b for b in view["buckets"]}
    assert set(buckets) == {0, 5}
    assert buckets[0] == {"start_ns": T0, "steps": 5, "working": 4, "max_ms": 1500.0, "median_ms": 2.5}
    assert buckets[5] == {"start_ns": T0 + 30 * S, "steps": 2, "working": 2, "max_ms": 8.0, "median_ms": 6.0}


def test_steps_outside_the_window_are_left_out():
    rows = [(1, T0 - 10 * S, 1, 1), (2, T0 + 61 * S, 1, 1), (3, T0 + 5 * S, 1, 1)]
    (view,) = tl.build([process_rows(rows)], since_ns=T0, until_ns=T0 + 60 * S, points=60)["processes"]
    assert view["steps"] == 1 and [s["step"] for s in view["slow_steps"]] == [3]


def test_slow_steps_are_the_slowest_and_every_one_over_the_threshold_within_bounds():
    # 300 steps of 2 ms, 70 of 50 ms (over 4x the median) spread over the window, slowest first.
    rows = [(i, T0 + i * 100 * MS, 2, 1) for i in range(300)]
    rows += [(1000 + i, T0 + 40 * S + i * 100 * MS, 50 + i * 0.01, 1) for i in range(70)]
    (view,) = tl.build([process_rows(rows)], since_ns=T0, until_ns=T0 + 60 * S, points=100)["processes"]
    assert view["slow_ms"] == 8.0  # 4 x the median working step, 2 ms
    assert len(view["slow_steps"]) == 70 and all(s["over"] for s in view["slow_steps"])
    durations = [s["duration_ms"] for s in view["slow_steps"]]
    assert durations == sorted(durations, reverse=True) and view["slow_steps"][0]["step"] == 1069
    row = view["slow_steps"][0]
    assert row["batch"] == 4 and row["tokens"] == 16 and row["running"] is None and row["working"] is True
    # No step over: the SLOW_TOP slowest still, none marked over.
    (quiet,) = tl.build([process_rows(rows[:300])], since_ns=T0, until_ns=T0 + 60 * S, points=100)["processes"]
    assert len(quiet["slow_steps"]) == tl.SLOW_TOP and not any(s["over"] for s in quiet["slow_steps"])
    # Many over: at most MAX_SLOW, the slowest.
    many = [(i, T0 + i * 10 * MS, 2 if i % 2 else 30 + i * 0.001, 1) for i in range(5000)]
    (bounded,) = tl.build([process_rows(many)], since_ns=T0, until_ns=T0 + 60 * S, points=100, slow_ms=10)["processes"]
    assert len(bounded["slow_steps"]) == tl.MAX_SLOW and bounded["slow_ms"] == 10
    slowest = sorted((r[2] for r in many), reverse=True)[:tl.MAX_SLOW]
    assert [s["duration_ms"] for s in bounded["slow_steps"]] == pytest.approx(slowest, abs=1e-3)


def test_a_slow_steps_gc_time_and_the_gc_marks():
    rows = [(1, T0 + 10 * S, 100, 1), (2, T0 + 20 * S, 1, 1)]
    gc = [(T0 + 10 * S + 20 * MS, 12, 2), (T0 + 30 * S, 3, 0), (T0 + 10 * S + 95 * MS, 10, 1)]  # the last half inside
    (view,) = tl.build([process_rows(rows, gc=gc)], since_ns=T0, until_ns=T0 + 60 * S, points=60,
                       slow_ms=50)["processes"]
    assert view["slow_steps"][0]["step"] == 1 and view["slow_steps"][0]["gc_ms"] == 17.0
    # Pauses of at least gc_ms (5 by default) are marks, in time order.
    assert [(g["duration_ms"], g["generation"]) for g in view["gc"]] == [(12.0, 2), (10.0, 1)]


def test_requests_in_buckets_of_their_finish_and_in_flight_oldest_first():
    requests = [("a", T0 + 1 * S, T0 + 1 * S + 100 * MS, T0 + 2 * S, "finished", 5, 8),
                ("b", T0 + 1 * S, -1, T0 + 3 * S, "aborted", 5, 0),
                ("c", T0 + 50 * S, T0 + 50 * S + 300 * MS, T0 + 59 * S, "finished", 5, 8),
                ("old", T0 - 9 * S, T0 - 8 * S, T0 - 1 * S, "finished", 5, 8)]
    in_flight = [{"id": "young", "arrived_ns": T0 + 58 * S, "phase": "decode", "prompt_tokens": 3, "output_tokens": 2},
                 {"id": "hung", "arrived_ns": T0 + 40 * S, "phase": "prefill", "prompt_tokens": 9, "output_tokens": -1}]
    out = tl.build([process_rows([], requests=requests, in_flight=in_flight)], since_ns=T0, until_ns=T0 + 60 * S,
                   points=10)
    assert out["requests"]["finished"] == 3
    first, last = out["requests"]["buckets"]
    assert first == {"start_ns": T0, "count": 2, "ttft_max_ms": 100.0, "ttft_median_ms": 100.0,
                     "e2e_max_ms": 2000.0, "e2e_median_ms": 1500.0}
    assert last["start_ns"] == T0 + 54 * S and last["ttft_max_ms"] == 300.0 and last["e2e_max_ms"] == 9000.0
    assert [r["id"] for r in out["in_flight"]["requests"]] == ["hung", "young"]
    hung = out["in_flight"]["requests"][0]
    assert hung["age_ms"] == 20000.0 and hung["output_tokens"] is None and hung["process"] == "worker 0"


def test_marks_of_the_window_and_the_stuck_steps_frames():
    captures = [{"id": "c1", "state": "done", "created_at": (T0 + 10 * S) / S, "finished_at": (T0 + 12 * S) / S},
                {"id": "c0", "state": "done", "created_at": (T0 - 100 * S) / S, "finished_at": (T0 - 90 * S) / S},
                {"id": "c2", "state": "capturing", "created_at": (T0 + 50 * S) / S, "finished_at": None}]
    firings = [{"at": (T0 + 11 * S) / S, "trigger": "trg-1", "name": "slow", "outcome": "fired", "metric": "step",
                "observed_ms": 1500.0, "threshold_ms": 1000.0, "capture": "c1"},
               {"at": (T0 - 5 * S) / S, "trigger": "trg-1", "outcome": "skipped"}]
    frames = [{"function": f"f{i}", "file": "x.py", "line": i} for i in range(20)]
    out = tl.build([], since_ns=T0, until_ns=T0 + 60 * S, points=10, captures=captures, firings=firings,
                   stuck=[{"process": "worker 0", "step": 7, "since_ns": T0, "age_s": 9.5, "threshold_s": 3.0,
                           "frames": frames}])
    assert [(m["id"], m["end_ns"]) for m in out["marks"]["captures"]] == [("c1", T0 + 12 * S), ("c2", None)]
    assert [(m["at_ns"], m["capture"]) for m in out["marks"]["firings"]] == [(T0 + 11 * S, "c1")]
    (stuck,) = out["stuck"]
    assert stuck["step"] == 7 and len(stuck["frames"]) == tl.MAX_STUCK_FRAMES and stuck["frames"][0]["function"] == "f19"


def test_a_newer_probes_extra_columns_are_in_the_row():
    held = process_rows([(1, T0 + S, 20, 1)])
    held.steps["gpu_memory_mb"] = array("q", [812])
    (view,) = tl.build([held], since_ns=T0, until_ns=T0 + 60 * S, points=10)["processes"]
    assert view["slow_steps"][0]["gpu_memory_mb"] == 812


# -- the store ----------------------------------------------------------------------------------------
def test_overlapping_reads_add_each_row_once_and_trim_to_the_window():
    held = process_rows([(i, T0 + i * S, 1, 1) for i in range(10)],
                        requests=[("a", T0, T0 + MS, T0 + 9 * S, "finished", 1, 1)])
    # The next read reaches 2 s back: steps 8 and 9 again, then 10 and 11; request a again, and b.
    again = {"steps": steps_dump([(i, T0 + i * S, 1, 1) for i in range(8, 12)]),
             "gc": {"start_ns": [], "duration_ns": [], "generation": [], "collected": [], "step_thread": []},
             "requests": {"id": ["a", "b"], "arrived_ns": [T0, T0 + S], "first_token_ns": [T0 + MS, -1],
                          "finished_ns": [T0 + 9 * S, T0 + 8 * S], "outcome": ["finished", "aborted"],
                          "prompt_tokens": [1, 1], "output_tokens": [1, 0]},
             "in_flight": [{"id": "x", "arrived_ns": T0 + 11 * S}]}
    held.absorb(again, T0 + 8 * S, T0 + 12 * S, whole=False)
    assert list(held.steps["step"]) == list(range(12))
    assert sorted(r[0] for r in held.requests) == ["a", "b"] and held.in_flight[0]["id"] == "x"
    assert held.read_ns == T0 + 12 * S
    held.trim(T0 + 5 * S)
    assert list(held.steps["step"]) == list(range(5, 12)) and held.complete_since_ns == T0 + 5 * S
    assert [r[0] for r in held.requests] == ["a", "b"]


def test_the_store_keeps_at_most_its_bound_of_steps(monkeypatch):
    monkeypatch.setattr(rw, "MAX_STEP_ROWS", 100)
    held = process_rows([(i, T0 + i * MS, 0.5, 1) for i in range(250)])
    held.trim(T0)
    assert held.step_count == 100 and held.steps["step"][0] == 150
    assert isinstance(held.steps["start_ns"], array)  # 8 bytes a value


def test_a_median_of_many_buckets_matches_statistics():
    rows = [(i, T0 + (i * 7919 % 60000) * MS, (i * 31) % 97 + 0.5, 1) for i in range(3000)]
    (view,) = tl.build([process_rows(rows)], since_ns=T0, until_ns=T0 + 60 * S, points=37)["processes"]
    size = view and (60 * S + 36) // 37
    for b in view["buckets"]:
        mine = [r[2] for r in rows if b["start_ns"] <= r[1] < b["start_ns"] + size]
        assert b["steps"] == len(mine) and abs(b["median_ms"] - statistics.median(mine)) < 1e-3


class _Conn:
    """A probe connection as the store sees one: an id, its JSON, its clock."""

    def __init__(self, ident: int) -> None:
        self.id = ident
        self.clock = type("Clock", (), {"correction_ns": 0})()
        self.identity = type("Identity", (), {"label": f"worker {ident}"})()

    def to_json(self) -> dict:
        return {"label": self.identity.label}


class _Queries:
    """The broker's two parts the store uses: the slots, and ``ask`` (answered with no dump, slowly)."""

    def __init__(self) -> None:
        from sidecar.service.channel.query_slots import QuerySlots

        self.slots = QuerySlots()
        self.asked: list[dict] = []

    async def ask(self, conns, fields, timeout_s):
        from sidecar.service.channel.queries import Reply

        self.asked.append(fields)
        await asyncio.sleep(0.05)
        return [Reply(c, None, "no answer within 10 s") for c in conns]


async def test_tabs_share_one_refresh_a_busy_process_keeps_its_rows_and_an_idle_store_is_dropped():
    from sidecar.service.channel.query_slots import Work

    store = rw.RecorderWindows(fresh_s=0.5, idle_s=0.3)
    queries, conns = _Queries(), [_Conn(1), _Conn(2)]
    snapshots = await asyncio.gather(*(store.read(queries, conns, 60) for _ in range(6)))
    assert len(queries.asked) == 2 and store.refreshes == 1  # one query per process for six tabs
    assert all(f["packed"] is True for f in queries.asked)  # rows as the rings hold them: no JSON made in the engine
    assert all(s.processes[0].error == "no answer within 10 s" for s in snapshots)
    await asyncio.sleep(0.6)
    with queries.slots.hold([conns[1]], Work("a stacks sampling of 60 s", 60)):
        snap = await store.read(queries, conns, 60)
    assert len(queries.asked) == 3  # the busy process was not asked
    assert snap.processes[1].note.startswith("busy: running a stacks sampling of 60 s")
    assert store.held_processes() == 2
    await asyncio.sleep(0.8)  # no read for longer than idle_s
    assert store.held_processes() == 0
    store.close()
