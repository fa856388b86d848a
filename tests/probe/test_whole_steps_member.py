"""The probe's trace says its step ranges are whole (sidecar/common/phases.py ``whole_steps``): every
ProfilerStep range opens at a step's begin and the last closes at a step boundary, so the analysis
takes none for cut off, however short the last (issue 28). The real torch.profiler, a simulated step
loop; recorded in one session and in parts (one session per step, joined: trace_parts.py)."""

import asyncio
import json
import os
import threading
import time

import pytest

from sidecar.analysis import analyze_path
from sidecar.probe.capture.profiler import StepCapture, WindowCapture
from sidecar.common.protocol import CaptureSpec
from test_step_capture import Reports, exporter, profiler_steps, work  # noqa: F401  (the fixture)

TABLE = {"engine: forward": "forward"}
SPECS = {"one session": {}, "in parts": {"record_shapes": True}}  # record_shapes: records_in_parts


def run(capture, steps, idle_s=0.0):
    """``steps`` working steps from step 0, ``idle_s`` of idle time after each: the last range holds none."""
    capture.begin(0)
    for n in range(steps):
        capture.on_step_begin(True, n)
        work()
        capture.on_step_end(True)
        time.sleep(idle_s)


def capture_of(tmp_path, exporter, spec, **kwargs):
    reports = Reports()
    path = tmp_path / "raw" / "w.json"
    return StepCapture(spec, str(path), reports, exporter, **kwargs), reports, path


@pytest.mark.parametrize("mode", SPECS)
def test_the_trace_says_its_steps_are_whole_and_the_short_last_one_counts(tmp_path, exporter, mode):
    capture, reports, path = capture_of(tmp_path, exporter, CaptureSpec(id="c1", steps=3, **SPECS[mode]))
    run(capture, 4, idle_s=0.1)  # the last range, with no idle time, is far under half the others
    assert reports.done.wait(20)
    assert reports.messages[-1].state == "done", reports.messages[-1]
    trace = json.loads(path.read_text())
    assert trace["inference_sidecar"] == {"whole_steps": True}, mode
    assert sorted(os.listdir(path.parent)) == ["w.json"]
    summary = analyze_path(path)
    (worker,) = [p for p in summary["processes"] if p["steps"]]
    assert [s["step"] for s in worker["steps"]] == [0, 1, 2]
    assert worker["steps"][2]["wall_us"] < 0.5 * worker["steps"][0]["wall_us"], worker["steps"]
    assert not any(s["partial"] for s in worker["steps"]), mode
    assert "cut off" not in summary["headline"], summary["headline"]


@pytest.mark.parametrize("mode", SPECS)
def test_one_member_holds_the_phase_table_and_the_fact(tmp_path, exporter, mode):
    capture, reports, path = capture_of(tmp_path, exporter, CaptureSpec(id="c2", steps=2, **SPECS[mode]),
                                        phase_table=TABLE)
    run(capture, 2)
    assert reports.done.wait(20)
    text = path.read_text()
    assert text.count('"inference_sidecar"') == 1
    assert json.loads(text)["inference_sidecar"] == {"phase_ranges": TABLE, "whole_steps": True}


@pytest.mark.parametrize("mode", SPECS)
def test_a_window_that_ends_after_a_step_that_did_no_work_does_not_claim_it(tmp_path, exporter, mode):
    # A step announced with work opens a range; it does none, and a stop request ends the window with
    # it: that range holds no working step.
    capture, reports, path = capture_of(tmp_path, exporter, CaptureSpec(id="c3", steps=5, **SPECS[mode]),
                                        phase_table=TABLE)
    run(capture, 2)
    capture.on_step_begin(True, 2)
    capture.request_stop("stopped by the user")
    capture.on_step_end(False)
    assert reports.done.wait(20)
    last = reports.messages[-1]
    assert last.state == "done" and last.steps_recorded == 2, last
    trace = json.loads(path.read_text())
    if mode == "one session":  # the range stays; the member no longer says the ranges are whole
        assert profiler_steps(path) == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
        assert trace["inference_sidecar"] == {"phase_ranges": TABLE, "whole_steps": False}
    else:  # its part is left out of the join: the trace ends with the last working step
        assert profiler_steps(path) == ["ProfilerStep#0", "ProfilerStep#1"]
        assert trace["inference_sidecar"] == {"phase_ranges": TABLE, "whole_steps": True}
    assert sorted(os.listdir(path.parent)) == ["w.json"], "no part left behind"


def test_a_step_that_did_no_work_inside_the_window_keeps_the_claim(tmp_path, exporter):
    capture, reports, path = capture_of(tmp_path, exporter, CaptureSpec(id="c4", steps=2))
    capture.begin(0)
    capture.on_step_begin(True, 0)
    work()
    capture.on_step_end(True)
    capture.on_step_begin(True, 1)  # announced with work, did none: step 1 again next
    capture.on_step_end(False)
    capture.on_step_begin(True, 1)
    work()
    capture.on_step_end(True)
    assert reports.done.wait(20)
    assert profiler_steps(path) == ["ProfilerStep#0", "ProfilerStep#1"]
    assert json.loads(path.read_text())["inference_sidecar"] == {"whole_steps": True}


def test_an_api_server_s_window_claims_no_whole_steps(tmp_path, exporter):
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        for name, table in (("with-table", TABLE), ("without", None)):
            reports = Reports()
            path = tmp_path / name / "api.json"
            capture = WindowCapture(CaptureSpec(id=name, steps=3), str(path), reports, exporter, loop,
                                    phase_table=table)
            capture.start_window()
            time.sleep(0.1)
            capture.request_stop("done")
            assert reports.done.wait(20)
            assert reports.messages[-1].state == "done", reports.messages[-1]
            member = json.loads(path.read_text()).get("inference_sidecar")
            assert member == ({"phase_ranges": TABLE} if table else None), name
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
