"""The shared life cycle, driven through CaptureManager and ScanManager with typed reports and fake
probe connections: arming in two phases, the common start step with delay, stop, grace, timeout,
lost processes, reports out of order, one job at a time across kinds, retention."""

import asyncio
import json
import time

import pytest

from sidecar.common.protocol import Arm, Begin, Stop, SyncArm
from sidecar.service.jobs import captures as captures_module
from sidecar.service.jobs.arming import lead_steps
from sidecar.service.jobs.model import JobBusy, NoProbes
from sidecar.service.export.merge import FinalizeResult, ProcessOutcome
from sidecar.service.jobs.params import CaptureRequest, ParamError, ProcessSelector, ScanRequest

from service_fakes import World, sent, until


@pytest.fixture
async def world(tmp_path):
    w = World(tmp_path)
    yield w
    await w.close()


@pytest.fixture
def fake_merge(monkeypatch):
    """The export without real traces: every process that reported done gets a file."""
    calls = []

    def finalize(capture_dir, records, max_bytes):
        records = list(records)
        calls.append(records)
        done = [r for r in records if r.state == "done"]
        return FinalizeResult(
            trace_file="trace.json.gz" if done else None, trace_bytes=100 if done else 0,
            processes={r.stem: ProcessOutcome(file=f"{r.stem}.pt.trace.json.gz", bytes=10) for r in done},
        )

    monkeypatch.setattr(captures_module.merge, "finalize_capture", finalize)
    return calls


async def test_capture_arms_begins_at_one_step_with_delay_and_finishes_done(world, fake_merge):
    core, w0, api = world.connect("engine_core"), world.connect("worker", 0), world.connect("api_server")
    w0.step_rate = 20.0
    capture = await world.captures.start(CaptureRequest(steps=2, delay=3))
    assert capture.state == "armed" and world.board.active is capture
    for conn in (core, w0, api):
        [arm] = sent(conn, Arm)
        assert arm.spec.id == capture.id and arm.spec.steps == 2
        assert not hasattr(arm.spec, "delay"), "delay is applied by the sidecar alone"

    await world.capture_report(core, capture.id, "armed", steps_seen=40)
    assert not sent(core, Begin), "begin waits for every step-driven process"
    await world.capture_report(w0, capture.id, "armed", steps_seen=41)
    await until(lambda: sent(w0, Begin))
    start = 41 + lead_steps(20.0) + 3
    assert capture.start_step == start
    assert [b.start_step for c in (core, w0) for b in sent(c, Begin)] == [start, start]
    assert not sent(api, Begin), "the API server records a window from arm on"

    await world.capture_report(api, capture.id, "capturing")
    assert capture.state == "armed", "the API server's window alone records no step"
    for conn in (core, w0):
        await world.capture_report(conn, capture.id, "capturing", first_step=start)
        assert capture.state == "capturing"
        await world.capture_report(conn, capture.id, "exporting", steps_recorded=2, first_step=start)
    assert not sent(api, Stop)
    await world.capture_report(core, capture.id, "done", steps_recorded=2, file=str(capture.dir / "raw" / "c.json"), bytes=9)
    await world.capture_report(w0, capture.id, "done", steps_recorded=2, file=str(capture.dir / "raw" / "w.json"), bytes=9)
    [stop] = sent(api, Stop)
    assert stop.job_id == capture.id and stop.reason == "steps recorded"
    assert world.captures.active is capture
    await world.capture_report(api, capture.id, "exporting")
    await world.capture_report(api, capture.id, "done", file=str(capture.dir / "raw" / "a.json"), bytes=9)
    assert world.captures.active is None and world.board.active is None
    await capture.done_event.wait()
    assert capture.state == "done" and capture.reason is None and capture.notes == []
    assert capture.trace_file == "trace.json.gz" and capture.files()[-1] == "trace.json.gz"
    assert world.finished == [capture]
    assert json.loads((capture.dir / "capture.json").read_text()) == capture.to_json()
    assert [r.role for r in fake_merge[0]] == ["api_server", "engine_core", "worker"]


async def test_a_scan_uses_the_same_two_phase_arming(world):
    w0, w1 = world.connect("worker", 0), world.connect("worker", 1)
    world.connect("api_server")
    scan = await world.scans.start(ScanRequest(steps=2, delay=5))
    assert [p.role for p in scan.processes] == ["worker", "worker"], "the API server takes no steps"
    assert sent(w0, SyncArm)[0].spec.steps == 2
    await world.sync_report(w0, scan.id, "armed", steps_seen=7)
    await world.sync_report(w1, scan.id, "armed", steps_seen=9)
    await until(lambda: sent(w1, Begin))
    assert sent(w0, Begin)[0].start_step == 9 + lead_steps(None) + 5, "no rate measured: the fallback lead"
    site = {"file": "/m.py", "path": "m.py", "line": 3, "function": "f", "op": "item", "phase": "forward",
            "count": 2, "count_per_step": 1.0, "blocked_us": 1.0, "first_step": 0, "last_step": 1,
            "classification": "hidden", "reason": ""}
    for conn in (w0, w1):
        await world.sync_report(conn, scan.id, "scanning", first_step=scan.start_step)
        assert scan.state == "scanning"
        await world.sync_report(conn, scan.id, "done", steps_recorded=2, treat_cpu_as_device=True, sites=[site])
    assert scan.state == "done" and scan.reason is None
    [merged] = scan.sites
    assert merged["count"] == 4 and merged["processes"] == [p.label for p in scan.processes]
    saved = json.loads((world.trace_dir / "scans" / f"{scan.id}.json").read_text())
    assert saved == json.loads(json.dumps(scan.to_json())) and saved["hidden"] == 1


async def test_one_job_at_a_time_across_kinds(world, fake_merge):
    world.connect("worker", 0)
    scan = await world.scans.start(ScanRequest(steps=1))
    with pytest.raises(JobBusy) as busy:
        await world.captures.start(CaptureRequest(steps=1))
    assert busy.value.active is scan
    with pytest.raises(JobBusy):
        await world.scans.start(ScanRequest(steps=1))
    await world.scans.stop()
    await until(lambda: world.board.active is None)
    assert scan.state == "cancelled", "stopped by its user before any step"
    capture = await world.captures.start(CaptureRequest(steps=1))
    with pytest.raises(JobBusy) as busy:
        await world.scans.start(ScanRequest(steps=1))
    assert busy.value.active is capture


async def test_no_probes_and_a_filter_that_selects_no_step_driven_process(world):
    with pytest.raises(NoProbes):
        await world.captures.start(CaptureRequest(steps=1))
    world.connect("api_server")
    world.connect("worker", 0)
    with pytest.raises(ParamError) as info:
        await world.captures.start(CaptureRequest(steps=1, processes=(ProcessSelector("api_server"),)))
    assert info.value.param == "processes"
    with pytest.raises(ParamError) as info:
        await world.captures.start(CaptureRequest(steps=1, activities=("cuda",)))
    assert info.value.param == "activities"
    assert world.board.active is None


async def test_a_probe_that_does_not_answer_arm_is_lost_and_the_others_begin(world, fake_merge):
    quiet, w1 = world.connect("worker", 0), world.connect("worker", 1)
    capture = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(w1, capture.id, "armed", steps_seen=5)
    await until(lambda: sent(w1, Begin))
    assert not sent(quiet, Begin)
    assert capture.processes[0].state == "lost"
    assert capture.processes[0].error == "did not answer 'arm' within 0.3 s"


async def test_a_late_start_is_noted(world, fake_merge):
    w0 = world.connect("worker", 0)
    capture = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(w0, capture.id, "armed", steps_seen=5)
    await until(lambda: capture.start_step is not None)
    await world.capture_report(w0, capture.id, "capturing", first_step=capture.start_step + 2)
    assert capture.notes and "started at step" in capture.notes[0]


async def test_a_new_connection_leads_by_the_rate_its_probe_reports_when_armed(world, fake_merge):
    core, w0 = world.connect("engine_core"), world.connect("worker", 0)
    assert core.step_rate is None and w0.step_rate is None, "no heartbeats yet: the sidecar measured no rate"
    capture = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(core, capture.id, "armed", steps_seen=50, step_rate=40.0)
    await world.capture_report(w0, capture.id, "armed", steps_seen=50)  # its flight recorder is off
    await until(lambda: capture.start_step is not None)
    lead_s = capture.processes[0].lead_s
    # Not the 2-step minimum: the fastest reported rate turns the lead in time into steps.
    assert capture.start_step >= 50 + lead_steps(40.0, lead_s) > 50 + lead_steps(None)


async def test_a_late_start_lengthens_the_next_lead_to_that_process(world, fake_merge):
    w0 = world.connect("worker", 0)
    w0.step_rate = 20.0
    first = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(w0, first.id, "armed", steps_seen=5)
    await until(lambda: first.start_step is not None)
    lead_s = first.processes[0].lead_s
    assert first.start_step - 5 == lead_steps(20.0, lead_s) and lead_s >= 0.5
    # Half a second late at 20 steps/s: the begin took the lead and half a second more.
    late = first.start_step + 10
    await world.capture_report(w0, first.id, "capturing", first_step=late)
    assert w0.begin_took_s == pytest.approx(lead_s + 0.5)
    await world.capture_report(w0, first.id, "exporting", steps_recorded=1, first_step=late)
    await world.capture_report(w0, first.id, "done", steps_recorded=1, first_step=late,
                               file=str(first.dir / "raw" / "w.json"), bytes=9)
    await first.done_event.wait()

    second = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(w0, second.id, "armed", steps_seen=100)
    await until(lambda: second.start_step is not None)
    assert second.processes[0].lead_s == pytest.approx(1.5 * (lead_s + 0.5))
    assert second.start_step - 100 >= lead_steps(20.0, 1.5 * (lead_s + 0.5))
    # This one on time: the slow spell fades, it is not forgotten at once.
    await world.capture_report(w0, second.id, "capturing", first_step=second.start_step)
    assert w0.begin_took_s == pytest.approx(0.8 * (lead_s + 0.5))


async def test_reports_out_of_order_or_of_the_other_kind_are_dropped_whole(world, fake_merge):
    w0 = world.connect("worker", 0)
    capture = await world.captures.start(CaptureRequest(steps=3))
    await world.capture_report(w0, capture.id, "armed", steps_seen=1)
    await world.capture_report(w0, capture.id, "exporting", steps_recorded=3)  # skips capturing
    rec = capture.processes[0]
    assert rec.state == "armed" and rec.steps_recorded == 0, "nothing of a refused report is applied"
    await world.sync_report(w0, capture.id, "scanning", steps_recorded=2)  # a scan's report, a capture's id
    assert rec.state == "armed" and rec.steps_recorded == 0
    await world.capture_report(w0, capture.id, "capturing", steps_recorded=0, first_step=1)
    await world.capture_report(w0, capture.id, "armed", steps_seen=9)
    assert rec.state == "capturing" and rec.steps_seen == 1


async def test_stop_sends_stop_and_a_silent_process_is_lost_after_the_grace(world, fake_merge):
    w0, w1 = world.connect("worker", 0), world.connect("worker", 1)
    capture = await world.captures.start(CaptureRequest(steps=5))
    for conn in (w0, w1):
        await world.capture_report(conn, capture.id, "armed", steps_seen=1)
        await world.capture_report(conn, capture.id, "capturing", first_step=1)
    assert await world.captures.stop("stopped by request") is capture
    assert [s.reason for c in (w0, w1) for s in sent(c, Stop)] == ["stopped by request"] * 2
    await world.capture_report(w0, capture.id, "exporting", steps_recorded=2)
    await world.capture_report(w0, capture.id, "done", steps_recorded=2, file="x", bytes=1)
    await capture.done_event.wait()
    assert capture.state == "partial"
    assert capture.processes[1].state == "lost" and "grace period" in capture.processes[1].error
    assert capture.reason.startswith("stopped by request; ")
    assert "recorded 2 of 5 steps" in capture.reason
    assert await world.captures.stop() is None


async def test_an_event_while_the_window_stop_is_sent_does_not_finish_the_job_twice(world, fake_merge):
    w0, api = world.connect("worker", 0), world.connect("api_server")
    capture = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(w0, capture.id, "armed", steps_seen=1)
    await until(lambda: sent(w0, Begin))
    for state in ("capturing", "exporting"):
        await world.capture_report(w0, capture.id, state, steps_recorded=1)
    api.ws.send_delay_s = 0.05
    finishing = asyncio.ensure_future(world.capture_report(w0, capture.id, "done", steps_recorded=1, file="f", bytes=1))
    await asyncio.sleep(0.01)  # the window's stop is on its way
    await world.board.on_probe_lost(api)
    await finishing  # would raise TransitionError (exporting -> exporting) if the end were checked only once
    await capture.done_event.wait()
    assert capture.state == "partial" and len(fake_merge) == 1


async def test_timeout_stops_the_job(world):
    w0 = world.connect("worker", 0)
    scan = await world.scans.start(ScanRequest(steps=5, timeout_s=0.2))
    await world.sync_report(w0, scan.id, "armed", steps_seen=1)
    await until(lambda: sent(w0, Stop), timeout=3)
    assert sent(w0, Stop)[0].reason == "timeout after 0.2 s"
    await world.sync_report(w0, scan.id, "failed", error="no step scanned before the scan ended (timeout after 0.2 s)")
    assert scan.state == "failed" and scan.reason.startswith("timeout after 0.2 s; ")


async def test_a_disconnected_or_unreachable_probe_is_lost(world):
    w0, w1 = world.connect("worker", 0), world.connect("worker", 1)
    w1.ws.reachable = False
    scan = await world.scans.start(ScanRequest(steps=1))
    assert scan.processes[1].error == "probe unreachable when arming"
    await world.sync_report(w0, scan.id, "armed", steps_seen=1)
    await world.board.on_probe_lost(w0)
    assert scan.processes[0].state == "lost" and scan.processes[0].error == "probe disconnected during the scan"
    assert scan.state == "failed" and world.board.active is None


async def test_retention_keeps_the_newest_finished_jobs_of_each_kind(tmp_path):
    world = World(tmp_path, keep=1)
    try:
        w0 = world.connect("worker", 0)
        ids = []
        for _ in range(2):
            scan = await world.scans.start(ScanRequest(steps=1))
            await world.sync_report(w0, scan.id, "failed", error="boom")
            assert scan.state == "failed"
            ids.append(scan.id)
        assert [s.id for s in world.scans.recent()] == [ids[1]]
        assert not (world.trace_dir / "scans" / f"{ids[0]}.json").exists()
        assert (world.trace_dir / "scans" / f"{ids[1]}.json").exists()
    finally:
        await world.close()
    # A saved scan outlives the sidecar as a baseline; one removed by retention does not.
    restarted = World(tmp_path, keep=1)
    try:
        w0 = restarted.connect("worker", 0)
        with pytest.raises(ParamError) as info:
            await restarted.scans.start(ScanRequest(steps=1, baseline=ids[0]))
        assert info.value.param == "baseline"
        scan = await restarted.scans.start(ScanRequest(steps=1, baseline=ids[1]))
        await restarted.sync_report(w0, scan.id, "armed", steps_seen=1)
        await restarted.sync_report(w0, scan.id, "scanning")
        await restarted.sync_report(w0, scan.id, "done", steps_recorded=1, sites=[])
        assert scan.state == "done" and scan.new_sites == []
    finally:
        await restarted.close()


# -- a stop before any step (issue #10, defect 8) ---------------------------------------------------
NOT_STARTED = "no step recorded before the job ended (stopped by request)"  # an armed probe's answer to a stop


async def test_a_stop_before_the_start_step_cancels_the_capture_and_drops_the_window(world, fake_merge, tmp_path):
    core, w0, api = world.connect("engine_core"), world.connect("worker", 0), world.connect("api_server")
    capture = await world.captures.start(CaptureRequest(steps=5))
    await world.capture_report(api, capture.id, "capturing")  # the API server's window opens at arm
    for conn in (core, w0):
        await world.capture_report(conn, capture.id, "armed", steps_seen=10)
    await until(lambda: sent(w0, Begin))
    raw = tmp_path / "probe-root" / "captures" / capture.id / "raw" / "api.json"
    raw.parent.mkdir(parents=True)
    raw.write_text('{"traceEvents": []}')

    stopping = asyncio.ensure_future(world.captures.stop("stopped by request"))
    await until(lambda: all(sent(c, Stop) for c in (core, w0, api)))
    assert capture.state == "armed", "nothing records steps yet"
    for conn in (core, w0):  # an armed probe ends at once (sidecar/common/step_window.py)
        await world.capture_report(conn, capture.id, "failed", error=NOT_STARTED)
    await world.capture_report(api, capture.id, "exporting")
    await world.capture_report(api, capture.id, "done", file=str(raw), bytes=19)
    assert (await stopping).state == "cancelled", "the stop's answer is the job's true state"
    assert capture.reason == "cancelled by the user before any step was recorded"
    assert capture.trace_file is None and capture.headline is None and capture.summary_file is None
    assert capture.files() == [] and fake_merge == [], "the API server's window alone is not merged"
    assert not raw.exists() and not raw.parent.parent.exists(), "its raw file is deleted"
    assert world.finished == [capture] and world.board.active is None
    assert json.loads((capture.dir / "capture.json").read_text())["state"] == "cancelled"


async def test_a_stop_before_the_start_step_cancels_a_scan(world):
    w0, w1 = world.connect("worker", 0), world.connect("worker", 1)
    scan = await world.scans.start(ScanRequest(steps=3))
    for conn in (w0, w1):
        await world.sync_report(conn, scan.id, "armed", steps_seen=4)
    await until(lambda: sent(w1, Begin))
    stopping = asyncio.ensure_future(world.scans.stop("stopped by request"))
    await until(lambda: sent(w0, Stop) and sent(w1, Stop))
    for conn in (w0, w1):
        await world.sync_report(conn, scan.id, "failed", error=NOT_STARTED)
    assert (await stopping).state == "cancelled"
    assert scan.reason == "cancelled by the user before any step was recorded" and scan.sites == []
    assert world.finished == [scan] and world.board.active is None
    saved = json.loads((world.trace_dir / "scans" / f"{scan.id}.json").read_text())
    assert saved["state"] == "cancelled"


async def test_a_stop_that_crosses_the_start_keeps_the_steps_recorded(world, fake_merge):
    w0, w1 = world.connect("worker", 0), world.connect("worker", 1)
    capture = await world.captures.start(CaptureRequest(steps=5))
    for conn in (w0, w1):
        await world.capture_report(conn, capture.id, "armed", steps_seen=1)
    await until(lambda: sent(w1, Begin))
    stopping = asyncio.ensure_future(world.captures.stop("stopped by request"))
    await until(lambda: sent(w0, Stop) and sent(w1, Stop))
    # w0 had begun when the stop reached it: it records the step it is in; w1 was still armed.
    await world.capture_report(w0, capture.id, "capturing", first_step=capture.start_step)
    await world.capture_report(w1, capture.id, "failed", error=NOT_STARTED)
    await world.capture_report(w0, capture.id, "exporting", steps_recorded=1)
    await world.capture_report(w0, capture.id, "done", steps_recorded=1, file="w0.json", bytes=1)
    await stopping
    await capture.done_event.wait()
    assert capture.state == "partial" and capture.reason.startswith("stopped by request; ")
    assert capture.trace_file == "trace.json.gz"


async def test_a_timeout_before_any_step_is_a_failure_not_a_cancellation(world, fake_merge):
    w0 = world.connect("worker", 0)
    capture = await world.captures.start(CaptureRequest(steps=2, timeout_s=0.2))
    await world.capture_report(w0, capture.id, "armed", steps_seen=1)
    await until(lambda: sent(w0, Stop), timeout=3)
    # A user's stop after the timeout's changes nothing: the engine took no step in time.
    assert await world.captures.stop() is capture
    await world.capture_report(w0, capture.id, "failed", error=NOT_STARTED.replace("stopped by request", "timeout"))
    await capture.done_event.wait()
    assert capture.state == "failed" and capture.reason.startswith("timeout after 0.2 s")


async def test_a_probe_slow_to_answer_arm_but_alive_is_waited_for(world, fake_merge):
    # A loaded host starved a worker's link thread past the arm wait (two vLLM servers on 2 cores): it
    # still sent heartbeats, so it is alive and waited for (up to ARM_REPLY_ALIVE_S), not lost.
    slow, w1 = world.connect("worker", 0), world.connect("worker", 1)
    capture = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(w1, capture.id, "armed", steps_seen=5)
    await asyncio.sleep(0.1)
    slow.observe_steps(5, time.time())  # a heartbeat after its arm left
    await asyncio.sleep(0.5)  # past the 0.3 s arm wait
    assert capture.processes[0].state != "lost" and not sent(w1, Begin)
    await world.capture_report(slow, capture.id, "armed", steps_seen=5)
    await until(lambda: sent(slow, Begin) and sent(w1, Begin))
    assert {p.state for p in capture.processes} == {"armed"}


async def test_a_silent_probe_is_lost_at_the_arm_wait_even_if_it_was_heard_before(world, fake_merge):
    quiet, w1 = world.connect("worker", 0), world.connect("worker", 1)
    quiet.observe_steps(5, time.time())  # heard from before the arm, silent after it
    capture = await world.captures.start(CaptureRequest(steps=1))
    await world.capture_report(w1, capture.id, "armed", steps_seen=5)
    await until(lambda: sent(w1, Begin), timeout=2.0)
    assert capture.processes[0].error == "did not answer 'arm' within 0.3 s"
