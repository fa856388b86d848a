"""The flight recorder's rings (sidecar/probe/flight_ring.py): what they keep, in which order, what a dump
taken while another thread writes may contain, what a step costs the garbage collector, the
environment variable that sizes the step ring, and what the link thread reads of the step ring
between dumps (the slowest step since a heartbeat, the step rate at "arm")."""

from __future__ import annotations

import gc
import json
import logging
import sys
import threading
import time

import pytest

from sidecar.probe import flight_ring
from sidecar.common.config import ENV_RECORDER_STEPS
from sidecar.probe.flight_ring import (
    DEFAULT_STEP_CAPACITY,
    STEP_FIELDS,
    MAX_STEP_CAPACITY,
    UNKNOWN,
    GcPauses,
    RequestRing,
    StepRing,
    _PackedRows,
    capacity_from_environment,
)

from .held_blocks import blocks_held


def record(ring: StepRing, step: int, **counts) -> None:
    ring.begin()
    ring.end(step, step % 2 == 0, **counts)


# -- StepRing ----------------------------------------------------------------------------------------
def test_a_step_row_holds_what_end_was_given_and_the_times_of_begin_and_end():
    ring = StepRing(8)
    before = time.time_ns()
    ring.begin()
    assert ring.open_since_ns >= before and ring.open_step == 0
    ring.end(41, True, batch=3, tokens=96, prefill_tokens=64, decode_tokens=32, running=3, waiting=2)
    after = time.time_ns()
    dump = ring.dump()
    assert dump["clock"] == "unix_ns" and dump["capacity"] == 8 and dump["written"] == 1
    assert dump["open_since_ns"] == 0 and ring.open_step == UNKNOWN
    steps = dump["steps"]
    assert list(steps) == list(STEP_FIELDS)
    assert {k: v for k, v in steps.items() if not k.endswith("_ns")} == {
        "step": [41], "working": [1], "batch": [3], "tokens": [96], "prefill_tokens": [64],
        "decode_tokens": [32], "running": [3], "waiting": [2]}
    assert before <= steps["start_ns"][0] <= steps["end_ns"][0] <= after
    json.dumps(dump)


def test_counts_not_given_are_unknown_and_an_end_without_begin_starts_where_it_ends():
    ring = StepRing(4)
    ring.end(7, False)
    steps = ring.dump()["steps"]
    assert steps["start_ns"] == steps["end_ns"]
    assert steps["working"] == [0]
    assert all(steps[name] == [UNKNOWN] for name in ("batch", "tokens", "prefill_tokens", "decode_tokens",
                                                     "running", "waiting"))


def test_an_unfinished_step_is_visible_to_other_threads_until_it_ends():
    ring = StepRing(4)
    record(ring, 0)
    ring.begin()
    dump = ring.dump()
    assert dump["open_since_ns"] == ring.open_since_ns > 0
    assert ring.open_step == 1  # the row it will take
    ring.end(1, True)
    assert ring.open_since_ns == 0 and ring.dump()["open_since_ns"] == 0


def test_the_step_thread_is_the_thread_of_the_first_begin():
    ring = StepRing(4)
    worker = threading.Thread(target=ring.begin)
    worker.start()
    worker.join()
    ring.begin()  # a later begin on another thread does not move it
    assert ring.step_thread_id == worker.ident != threading.get_ident()


@pytest.mark.parametrize("written", [0, 1, 5, 6, 7, 13, 100])
def test_wrap_around_keeps_exactly_the_newest_capacity_rows_oldest_first(written):
    capacity = 6
    ring = StepRing(capacity)
    for step in range(written):
        record(ring, step, batch=step * 10)
    dump = ring.dump()
    expected = list(range(max(0, written - capacity), written))
    assert dump["written"] == written
    assert dump["steps"]["step"] == expected
    assert dump["steps"]["batch"] == [s * 10 for s in expected]
    ends = dump["steps"]["end_ns"]
    assert ends == sorted(ends)


def test_since_keeps_the_steps_that_end_at_or_after_it():
    ring = StepRing(16)
    for step in range(10):
        record(ring, step)
    ends = ring.dump()["steps"]["end_ns"]
    cut = ends[6]
    kept = ring.dump(since_ns=cut)["steps"]
    assert kept["step"] == [s for s, e in zip(range(10), ends) if e >= cut]
    assert kept["step"][0] <= 6 and kept["step"][-1] == 9
    assert all(len(column) == len(kept["step"]) for column in kept.values())
    assert ring.dump(since_ns=ends[-1] + 1)["steps"]["step"] == []


def test_since_tests_every_row_when_the_wall_clock_was_stepped_back(monkeypatch):
    clock = iter([10, 20, 5, 30, 12, 40])  # end times of six steps (no begin: start = end)
    monkeypatch.setattr("sidecar.probe.flight_ring.time_ns", lambda: next(clock))
    ring = StepRing(8)
    for step in range(6):
        ring.end(step, True, batch=step)
    steps = ring.dump(since_ns=15)["steps"]
    assert steps["step"] == [1, 3, 5] and steps["batch"] == [1, 3, 5] and steps["end_ns"] == [20, 30, 40]
    assert ring.dump(since_ns=50)["steps"]["step"] == []
    assert ring.dump(since_ns=1)["steps"]["step"] == [0, 1, 2, 3, 4, 5]


def test_bad_capacity_is_refused():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            StepRing(bad)


def test_memory_is_fixed_and_the_default_ring_holds_ten_minutes_at_100_steps_per_second():
    assert DEFAULT_STEP_CAPACITY >= 10 * 60 * 100
    ring = StepRing()
    size = ring.memory_bytes
    assert size == (DEFAULT_STEP_CAPACITY + 1) * len(STEP_FIELDS) * 8 <= 6 * 2**20
    for step in range(3 * 1000):
        record(ring, step)
    assert ring.memory_bytes == size


def test_a_dump_taken_while_a_writer_hammers_end_holds_only_whole_consecutive_rows():
    """Every column of step n is derived from n, so any row mixing two writes shows; the rows must
    also be consecutive, newest last, and never more than the capacity."""
    capacity = 64
    ring = StepRing(capacity)
    stop = threading.Event()

    def writer():
        step = 0
        while not stop.is_set():
            ring.begin()
            ring.end(step, step % 3 == 0, batch=step + 1, tokens=step + 2, prefill_tokens=step + 3,
                     decode_tokens=step + 4, running=step + 5, waiting=step + 6)
            step += 1

    thread = threading.Thread(target=writer, daemon=True)
    previous_switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter allows
    thread.start()
    try:
        dumps = 0
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            dump = ring.dump()
            steps = dump["steps"]
            n = len(steps["step"])
            assert n <= capacity
            assert all(len(column) == n for column in steps.values())
            if n:
                assert steps["step"] == list(range(steps["step"][0], steps["step"][0] + n))
                assert steps["step"][-1] < dump["written"]
            for j, step in enumerate(steps["step"]):
                assert steps["working"][j] == (1 if step % 3 == 0 else 0)
                for offset, name in enumerate(("batch", "tokens", "prefill_tokens", "decode_tokens",
                                               "running", "waiting"), start=1):
                    assert steps[name][j] == step + offset, (name, step, steps[name][j])
                assert steps["start_ns"][j] <= steps["end_ns"][j]
            dumps += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(previous_switch)
    assert dumps > 10 and ring.written > capacity * 10  # both sides really ran, and wrapped


class InterruptedStepRing(StepRing):
    """A StepRing whose next read of ``written`` lets ``interrupt`` run right after it: the worst a
    writer thread can do to a dump, made deterministic (a dump reads ``written``, copies, reads it
    again)."""

    __slots__ = ("interrupt",)

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.interrupt = None

    @property
    def written(self) -> int:
        value = _PackedRows.written.__get__(self)
        hook, self.interrupt = self.interrupt, None
        if hook is not None:
            hook()
        return value

    @written.setter
    def written(self, value: int) -> None:
        _PackedRows.written.__set__(self, value)


@pytest.mark.parametrize("steps_between", [0, 1, 2, 3, 5, 9])
def test_a_dump_excludes_every_row_a_writer_touched_while_it_copied(steps_between):
    """Between the dump's first read of ``written`` and its copy, the writer ends ``steps_between``
    steps and starts packing one more that it has not counted yet (a garbage row in the next slot)."""
    capacity = 4
    ring = InterruptedStepRing(capacity)
    for step in range(10):
        record(ring, step, batch=step)

    def writer():
        for step in range(10, 10 + steps_between):
            record(ring, step, batch=step)
        slot = _PackedRows.written.__get__(ring) % (capacity + 1)
        ring._pack(ring._rows, slot * ring._row_bytes, *([-7] * len(STEP_FIELDS)))  # begun, not counted

    ring.interrupt = writer
    steps = ring.dump()["steps"]
    assert -7 not in steps["step"]
    assert steps["batch"] == steps["step"]
    assert steps["step"] == list(range(10 + steps_between - capacity, 10))[-capacity:]
    assert all(step < 10 for step in steps["step"])  # rows counted after the first read are not shown


def test_end_holds_nothing_more_per_step():
    ring = StepRing(1024)
    for step in range(100):  # warm up: the interpreter's specialisations, first allocations
        record(ring, step, batch=1, tokens=2)
    # The ring holds its counter (one int, replaced each step); 10,000 more steps must hold no more.
    def steps(first: int, count: int) -> None:
        for step in range(first, first + count):
            ring.begin()
            ring.end(step, True, batch=8, tokens=step * 7, prefill_tokens=5, decode_tokens=3, running=8,
                     waiting=0)

    after_some, after_more = blocks_held(steps, flight_ring.__file__)
    assert after_more <= after_some <= 1


# -- GcPauses ------------------------------------------------------------------------------------------
def test_a_full_collection_is_recorded_with_its_generation_and_the_step_thread_flag():
    ring = StepRing(4)
    pauses = GcPauses(16, step_thread_id=lambda: ring.step_thread_id, min_pause_ns=0)
    pauses.install()
    try:
        def step_thread():
            ring.begin()
            gc.collect()
            ring.end(0, True)

        thread = threading.Thread(target=step_thread)
        thread.start()
        thread.join()
        gc.collect()  # on this thread: not the step thread
    finally:
        pauses.uninstall()
    dump = pauses.dump()
    step = ring.dump()["steps"]
    inside = [j for j, start in enumerate(dump["start_ns"])
              if step["start_ns"][0] <= start and start + dump["duration_ns"][j] <= step["end_ns"][0]]
    assert inside and all(dump["step_thread"][j] == 1 for j in inside)  # every pause of the step thread
    on_step = next(j for j in inside if dump["generation"][j] == 2)  # its gc.collect()
    assert dump["duration_ns"][on_step] > 0
    off_step = max(j for j, g in enumerate(dump["generation"]) if g == 2)  # this thread's, after the join
    assert off_step not in inside and dump["step_thread"][off_step] == 0
    assert all(d >= 0 for d in dump["duration_ns"]) and all(c >= 0 for c in dump["collected"])
    assert pauses.errors == 0
    assert dump["collections"] >= len(dump["start_ns"]) and dump["min_pause_ns"] == 0
    assert dump["pause_ns"] >= sum(dump["duration_ns"])
    assert dump["step_thread_pause_ns"] >= dump["duration_ns"][on_step]
    json.dumps(dump)


def test_install_is_idempotent_and_uninstall_removes_the_callback():
    pauses = GcPauses(4)
    callbacks = len(gc.callbacks)
    pauses.install()
    pauses.install()
    assert len(gc.callbacks) == callbacks + 1
    pauses.uninstall()
    assert len(gc.callbacks) == callbacks
    written = pauses.written
    gc.collect()
    assert pauses.written == written
    pauses.uninstall()  # twice: harmless


def drive(pauses: GcPauses, generation: int, collected: int, pause_ns: int = 0) -> None:
    """One collection's start and stop, the callback driven directly; ``pause_ns``: at least this long."""
    pauses._on_gc("start", {"generation": generation, "collected": 0, "uncollectable": 0})
    until = time.time_ns() + pause_ns
    while time.time_ns() < until:
        pass
    pauses._on_gc("stop", {"generation": generation, "collected": collected, "uncollectable": 0})


def test_the_gc_ring_wraps_and_filters():
    pauses = GcPauses(3, min_pause_ns=0)
    for n in range(5):
        drive(pauses, n % 3, n)
    dump = pauses.dump()
    assert dump["collected"] == [2, 3, 4] and dump["generation"] == [2, 0, 1]
    assert dump["step_thread"] == [0, 0, 0]  # no step thread known
    assert dump["collections"] == 5
    cut = dump["start_ns"][2] + dump["duration_ns"][2]
    assert pauses.dump(since_ns=cut)["collected"] == [4]


def test_short_pauses_take_no_row_but_count_in_the_totals():
    here = threading.get_ident()
    pauses = GcPauses(8, step_thread_id=lambda: here, min_pause_ns=2_000_000)
    drive(pauses, 0, 1)  # a few µs
    drive(pauses, 2, 9, pause_ns=3_000_000)
    drive(pauses, 0, 1)
    dump = pauses.dump()
    assert dump["collected"] == [9] and dump["step_thread"] == [1] and dump["duration_ns"][0] >= 3_000_000
    assert dump["collections"] == 3 and pauses.written == 1
    assert dump["pause_ns"] == dump["step_thread_pause_ns"] > dump["duration_ns"][0]


def test_the_gc_callback_never_raises():
    def broken_thread_id():
        raise RuntimeError("boom")

    pauses = GcPauses(3, step_thread_id=broken_thread_id, min_pause_ns=0)
    drive(pauses, 0, 1)
    pauses._on_gc("stop", None)  # a stop without its start, and no info
    assert pauses.errors == 2
    pauses._step_thread_id = lambda: None
    drive(pauses, 1, 2)
    assert pauses.dump()["collected"] == [2] and pauses.errors == 2


# -- RequestRing ------------------------------------------------------------------------------------------
def test_requests_wrap_and_their_outcomes_map_to_names():
    ring = RequestRing(3)
    outcomes = ["finished", "aborted", "error", "finished", "cancelled?"]
    for n, outcome in enumerate(outcomes):
        ring.add(f"req-{n}", 1000 + n, 1500 + n if n != 3 else UNKNOWN, 2000 + n, outcome, 10 * n, n)
    dump = ring.dump()
    assert dump == {
        "id": ["req-2", "req-3", "req-4"],
        "arrived_ns": [1002, 1003, 1004],
        "first_token_ns": [1502, UNKNOWN, 1504],
        "finished_ns": [2002, 2003, 2004],
        "outcome": ["error", "finished", "unknown"],
        "prompt_tokens": [20, 30, 40],
        "output_tokens": [2, 3, 4],
    }
    assert ring.dump(since_ns=2004)["id"] == ["req-4"]
    assert ring.memory_bytes == 4 * 6 * 8 + 4 * 8


def test_a_request_dump_filters_out_of_order_rows_with_their_ids():
    ring = RequestRing(8)
    for n, finished in enumerate([50, 10, 60, 20, 70]):
        ring.add(f"r{n}", 0, UNKNOWN, finished, "finished", n, n)
    dump = ring.dump(since_ns=30)
    assert dump["id"] == ["r0", "r2", "r4"] and dump["finished_ns"] == [50, 60, 70]
    assert dump["prompt_tokens"] == [0, 2, 4] and dump["outcome"] == ["finished"] * 3


def test_a_request_dump_under_a_concurrent_writer_pairs_each_id_with_its_own_row():
    ring = RequestRing(32)
    stop = threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            ring.add(f"r{n}", n, n + 1, n + 2, "finished", n + 3, n + 4)
            n += 1

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            dump = ring.dump()
            for j, rid in enumerate(dump["id"]):
                n = int(rid[1:])
                assert (dump["arrived_ns"][j], dump["finished_ns"][j], dump["output_tokens"][j]) == (n, n + 2, n + 4)
    finally:
        stop.set()
        thread.join()


class InterruptingIds(list):
    """The id list of a RequestRing whose copy (a slice) first lets ``writes`` requests be added."""

    def __init__(self, items, ring: RequestRing, writes: int) -> None:
        super().__init__(items)
        self.ring, self.writes = ring, writes

    def __getitem__(self, index):
        writes, self.writes = self.writes, 0
        for n in range(writes):
            self.ring.add(f"late-{n}", -1, -1, 10**6 + n, "finished", 0, 0)
        return super().__getitem__(index)


@pytest.mark.parametrize("writes", [1, 2, 3, 8])
def test_requests_added_between_the_two_copies_of_a_dump_are_left_out(writes):
    ring = RequestRing(4)
    for n in range(6):
        ring.add(f"r{n}", n, n, 100 + n, "finished", n, n)
    ring._ids = InterruptingIds(ring._ids, ring, writes)
    dump = ring.dump()
    assert all(rid == f"r{t - 100}" for rid, t in zip(dump["id"], dump["finished_ns"]))
    # 6 rows when the dump began, 6 + writes when its copies were done: rows [6 + writes - 4, 6)
    assert dump["id"] == [f"r{n}" for n in range(2 + writes, 6)]


# -- SIDECAR_RECORDER_STEPS --------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, expected", [
    (None, DEFAULT_STEP_CAPACITY), ("", DEFAULT_STEP_CAPACITY), ("0", 0), (" 00 ", 0), ("1000", 1000),
    (str(MAX_STEP_CAPACITY), MAX_STEP_CAPACITY),
])
def test_the_step_capacity_comes_from_the_environment(raw, expected, caplog):
    env = {} if raw is None else {ENV_RECORDER_STEPS: raw}
    with caplog.at_level(logging.ERROR):
        assert capacity_from_environment(env) == expected
    assert not caplog.records


@pytest.mark.parametrize("raw", ["ten", "-5", "1.5", "1_000", "٣"])
def test_a_bad_step_capacity_falls_back_to_the_default_with_an_error_naming_the_variable(raw, caplog):
    with caplog.at_level(logging.ERROR):
        assert capacity_from_environment({ENV_RECORDER_STEPS: raw}) == DEFAULT_STEP_CAPACITY
    assert any(ENV_RECORDER_STEPS in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


def test_a_huge_step_capacity_is_clamped_with_an_error(caplog):
    with caplog.at_level(logging.ERROR):
        assert capacity_from_environment({ENV_RECORDER_STEPS: "10000000000"}) == MAX_STEP_CAPACITY
    assert any(ENV_RECORDER_STEPS in r.getMessage() for r in caplog.records)


def test_the_step_capacity_reads_the_process_environment_by_default(monkeypatch):
    monkeypatch.setenv(ENV_RECORDER_STEPS, "123")
    assert capacity_from_environment() == 123


def test_slowest_since_reads_only_the_steps_that_ended_since_the_last_read(monkeypatch):
    import sidecar.probe.flight_ring as fr

    clock = iter(range(0, 10**12, 10**6))  # each clock read 1 ms after the last
    monkeypatch.setattr(fr, "time_ns", lambda: next(clock))
    ring = StepRing(capacity=4)
    assert ring.slowest_since(0) == (None, None, 0)
    for step, extra_reads in ((1, 0), (2, 5), (3, 1)):
        ring.begin()
        for _ in range(extra_reads):
            next(clock)  # the step takes longer
        ring.end(step, True)
    ms, step, seen = ring.slowest_since(0)
    assert (step, seen) == (2, 3) and ms == 6.0
    assert ring.slowest_since(seen) == (None, None, 3)  # nothing new
    for step in range(4, 10):  # more than the ring holds: the overwritten rows are skipped
        ring.begin()
        ring.end(step, True)
    ms, step, seen = ring.slowest_since(3)
    assert seen == 9 and ms == 1.0 and step in (6, 7, 8, 9)


def test_recent_rate_counts_the_working_steps_that_ended_in_the_window():
    ring = StepRing(capacity=64)
    assert ring.recent_rate(now_ns=10**12) is None, "no step yet"
    second = 10**9
    # Working steps 1..20, one every 50 ms, ending at 10 s (20 steps/s), with an idle step between.
    for i in range(1, 21):
        ring.end(i, True, now_ns=10 * second - (20 - i) * 50_000_000)
    ring.end(20, False, now_ns=10 * second + 10_000_000)  # no work: the count stays 20
    assert ring.recent_rate(2.0, now_ns=10 * second + 20_000_000) == pytest.approx(19 / 0.96)
    # Only the rows of the window count (ended at 9.5 s or later: steps 10..20, the idle one last).
    assert ring.recent_rate(0.52, now_ns=10 * second + 20_000_000) == pytest.approx(10 / 0.51)
    assert ring.recent_rate(2.0, now_ns=20 * second) is None, "an engine idle for 10 s has no rate lately"


def test_recent_rate_of_an_idle_spinning_engine_or_a_small_ring():
    ring = StepRing(capacity=4)
    for i in range(10):
        ring.end(5, False, now_ns=10**9 + i * 1_000_000)  # steps with no work
    assert ring.recent_rate(2.0, now_ns=10**9 + 10**7) is None
    for i in range(6, 16):  # more than the ring holds: only its 4 rows are read
        ring.end(i, True, now_ns=2 * 10**9 + i * 10_000_000)
    assert ring.recent_rate(2.0, now_ns=2 * 10**9 + 16 * 10**7) == pytest.approx(3 / 0.03)
