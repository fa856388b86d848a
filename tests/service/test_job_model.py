"""The job model without any I/O: state tables, transitions, ids, the verdict, the common start step."""

import re

import pytest

from sidecar.service.jobs import arming
from sidecar.service.jobs import states as st
from sidecar.service.jobs.captures import Capture, CaptureProcess
from sidecar.service.jobs.model import CAPTURE, SCAN, verdict
from sidecar.service.jobs.params import CaptureRequest, ScanRequest
from sidecar.service.jobs.scans import Scan, ScanProcess

from service_fakes import identity


def capture(*roles, steps=3):
    procs = [CaptureProcess(conn=None, identity=identity(role, rank)) for role, rank in roles]
    return Capture(id=CAPTURE.new_id(), request=CaptureRequest(steps=steps), dir=None, processes=procs)


def scan(*roles, steps=3):
    procs = [ScanProcess(conn=None, identity=identity(role, rank)) for role, rank in roles]
    return Scan(id=SCAN.new_id(), request=ScanRequest(steps=steps), processes=procs)


@pytest.mark.parametrize("table", [st.CAPTURE_STATES, st.SCAN_STATES])
def test_job_tables_end_in_the_final_states_and_reach_them_all(table):
    targets = set().union(*table.values())
    ended = {s for s in targets if s not in table}
    assert ended == set(st.FINAL)
    reachable, todo = {st.ARMED}, [st.ARMED]
    while todo:
        for nxt in table.get(todo.pop(), ()):
            if nxt not in reachable:
                reachable.add(nxt)
                todo.append(nxt)
    assert reachable == set(table) | ended


@pytest.mark.parametrize("table", [st.CAPTURE_PROCESS_STATES, st.SCAN_PROCESS_STATES])
def test_every_live_process_state_can_be_lost_or_fail_and_lost_is_the_end(table):
    for state, nexts in table.items():
        if state not in st.P_TERMINAL:
            assert {st.P_LOST, "failed"} <= nexts, state
    assert st.P_LOST not in table


def test_capture_goes_through_exporting_and_a_scan_does_not():
    c = capture(("worker", 0))
    with pytest.raises(st.TransitionError, match="armed -> done"):
        c.advance(st.DONE)
    c.advance(st.CAPTURING)
    c.advance(st.EXPORTING)
    c.advance(st.PARTIAL)
    with pytest.raises(st.TransitionError):
        c.advance(st.DONE)  # final is final
    s = scan(("worker", 0))
    with pytest.raises(st.TransitionError):
        s.advance(st.EXPORTING)
    s.advance(st.SCANNING)
    with pytest.raises(st.TransitionError):
        s.advance(st.SCANNING)
    s.advance(st.DONE)
    assert s.state == st.DONE


def test_process_moves_follow_the_kind_table():
    c = capture(("worker", 0))
    [rec] = c.processes
    assert not c.can_move(rec, "exporting") and c.can_move(rec, "capturing")
    assert not c.can_move(rec, "scanning"), "a capture's process does not scan"
    c.move(rec, "capturing")
    c.move(rec, "exporting")
    c.move(rec, "done")
    c.move(rec, "failed", "dropped: capture size limit")  # the sidecar's export may still reject it
    assert rec.error == "dropped: capture size limit" and rec.ended
    with pytest.raises(st.TransitionError, match=re.escape(rec.label)):
        c.move(rec, st.P_LOST)
    s = scan(("worker", 0))
    [srec] = s.processes
    s.move(srec, "scanning")
    s.move(srec, "done")
    with pytest.raises(st.TransitionError):
        s.move(srec, "failed")  # nothing of a scan's is rejected after its process is done


def test_ids_are_distinct_per_kind():
    cid, sid = CAPTURE.new_id(), SCAN.new_id()
    assert re.fullmatch(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}", cid)
    assert re.fullmatch(r"s[0-9]{8}-[0-9]{6}-[0-9a-f]{6}", sid)
    assert CAPTURE.is_id(cid) and SCAN.is_id(sid)
    assert not CAPTURE.is_id(sid) and not SCAN.is_id(cid)
    assert not CAPTURE.is_id(cid + "\n") and not CAPTURE.is_id("../" + cid)


def test_verdict_done_partial_failed():
    c = capture(("engine_core", None), ("worker", 0), ("api_server", None), steps=3)
    core, worker, api = c.processes
    for rec in c.processes:
        rec.state, rec.steps_recorded = "done", 3
    api.steps_recorded = 0  # a window process has no steps to fall short of
    assert verdict(c, [], has_result=True) == ("done", None)

    worker.steps_recorded = 2
    c.stop_reason = "stopped by request"
    state, reason = verdict(c, ["size limit of 1 MiB reached"], has_result=True)
    assert state == "partial"
    assert reason == (f"stopped by request; size limit of 1 MiB reached; {worker.label}: recorded 2 of 3 steps")

    core.state, core.error = "lost", "probe disconnected during the capture"
    worker.state, worker.error = "failed", None
    state, reason = verdict(c, [], has_result=False)
    assert state == "failed"
    assert reason == (f"stopped by request; {core.label}: probe disconnected during the capture; {worker.label}: failed")
    c.stop_reason = None
    core.state = worker.state = "done"
    worker.steps_recorded = 3
    assert verdict(c, [], has_result=False) == ("failed", "no engine step was recorded")


def test_verdict_of_a_scan_says_scanned_and_merges_repeated_reasons():
    s = scan(("worker", 0), steps=4)
    [rec] = s.processes
    rec.state, rec.steps_recorded = "done", 1
    assert verdict(s, ["x", "x"], has_result=True) == ("partial", f"x; {rec.label}: scanned 1 of 4 steps")


@pytest.mark.parametrize("table, running", [(st.CAPTURE_STATES, st.CAPTURING), (st.SCAN_STATES, st.SCANNING)])
def test_only_a_job_that_recorded_nothing_can_be_cancelled(table, running):
    assert st.allowed(table, st.ARMED, st.CANCELLED)
    for state in table:
        if state != st.ARMED:
            assert not st.allowed(table, state, st.CANCELLED), state
    assert st.CANCELLED in st.FINAL and st.CANCELLED not in table


@pytest.mark.parametrize("seen, rate, delay, expected", [
    ([10, 12], None, 0, 14),  # no rate measured yet (a new connection): the minimum lead
    ([10, 12], 0.0, 0, 14),  # the lead is at least 2 steps
    ([10, 12], 20.0, 0, 12 + 2 + 10),  # plus half a second at the fastest rate
    ([10, 12], 20.0, 7, 12 + 2 + 10 + 7),  # delay: working steps skipped, added by the sidecar only
    ([0], 3.0, 0, 0 + 2 + 2),
])
def test_the_common_start_step(seen, rate, delay, expected):
    assert arming.start_step(seen, rate, delay) == expected


@pytest.mark.parametrize("round_trip_s, expected", [
    (None, 12 + 2 + 10),  # no reply timed: half a second at the fastest rate
    (0.05, 12 + 2 + 10),  # a quick reply: still the half second
    (1.0, 12 + 2 + 40),  # a slow one (a loaded host): begin travels as slowly, so two such ahead
    (60.0, 12 + 2 + 60),  # never more than the arm reply's own limit (3 s)
])
def test_a_slow_arm_reply_lengthens_the_lead(round_trip_s, expected):
    assert arming.start_step([10, 12], 20.0, 0, arming.lead_seconds(round_trip_s)) == expected


@pytest.mark.parametrize("took_s, expected_s", [
    (0.0, 0.5),  # nothing learned: the floor
    (0.2, 0.5),  # a begin that took less than the floor's margin: still the floor
    (1.0, 1.5),  # one that took a second: half as much again
    (10.0, 3.0),  # never more than the arm reply's limit
])
def test_a_begin_that_once_came_late_lengthens_the_lead(took_s, expected_s):
    assert arming.lead_seconds(0.01, took_s) == pytest.approx(expected_s)


def test_how_long_a_late_begin_took():
    # Sent half a second ahead, it reached a process stepping 20 times a second 4 steps late.
    assert arming.begin_took(0.5, 4, 20.0) == pytest.approx(0.7)
    assert arming.begin_took(0.5, 0, 20.0) is None, "on time: nothing to learn"
    assert arming.begin_took(0.5, 4, None) is None and arming.begin_took(0.5, 4, 0.0) is None


def test_a_count_is_projected_to_when_begin_leaves():
    # Answered 2 s before the slowest reply let the sidecar begin, at 100 steps/s: 200 steps on.
    assert arming.projected(1000, 100.0, 2.0) == 1200
    assert arming.projected(1000, None, 2.0) == 1000 and arming.projected(1000, 100.0, -0.1) == 1000


def test_the_fastest_rate_ignores_processes_with_no_rate_yet():
    assert arming.fastest_rate([None, 3.0, 250.0, None]) == 250.0
    assert arming.fastest_rate([None, None]) is None
    assert arming.fastest_rate([0.0]) == 0.0
