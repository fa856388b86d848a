"""A capture with heavy options recorded as one torch.profiler session per step and joined into one
trace (sidecar/probe/capture/trace_parts.py): the real torch.profiler, a simulated step loop."""

import json
import os

import pytest
import torch
import torch.profiler as tp

from sidecar.probe.capture.profiler_options import records_in_parts
from sidecar.probe.capture.profiler import StepCapture
from sidecar.probe.capture.trace_parts import events_span, join_parts, part_path
from sidecar.common.protocol import CaptureSpec
from test_step_capture import Reports, exporter  # noqa: F401  (the fixture)


def work():
    x = torch.randn(16, 16)
    return (x @ x).sum()


def session(path, step_num):
    prof = tp.profile(activities=[tp.ProfilerActivity.CPU], schedule=lambda _s: tp.ProfilerAction.RECORD,
                      record_shapes=True)
    prof.step_num = step_num
    prof.start()
    work()
    prof.stop()
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def test_two_sessions_join_into_one_trace_with_every_event_and_the_first_header(tmp_path):
    a, b = session(tmp_path / "a.json", 0), session(tmp_path / "b.json", 1)
    out = tmp_path / "joined.json"
    size = join_parts([str(tmp_path / "a.json"), str(tmp_path / "b.json")], str(out))
    joined = json.loads(out.read_text())
    assert size == out.stat().st_size
    assert len(joined["traceEvents"]) == len(a["traceEvents"]) + len(b["traceEvents"])
    names = [e["name"] for e in joined["traceEvents"]]
    assert names.count("ProfilerStep#0") == 1 and names.count("ProfilerStep#1") == 1
    assert joined["baseTimeNanoseconds"] == a["baseTimeNanoseconds"] == b["baseTimeNanoseconds"]
    assert joined["traceName"] == str(out)
    assert {k: v for k, v in joined.items() if k not in ("traceEvents", "traceName")} == \
        {k: v for k, v in a.items() if k not in ("traceEvents", "traceName")}


def test_a_file_not_shaped_as_kineto_writes_is_refused(tmp_path):
    (tmp_path / "x.json").write_text('{"events": []}')
    with pytest.raises(ValueError, match="traceEvents"):
        events_span(str(tmp_path / "x.json"))
    (tmp_path / "y.json").write_text('{"traceEvents": [{"a": 1}, "no tail"')
    with pytest.raises(ValueError, match="does not close"):
        events_span(str(tmp_path / "y.json"))


def test_only_options_whose_stop_grows_with_the_events_record_in_parts():
    assert not records_in_parts(CaptureSpec(id="c", steps=5), "none")
    assert not records_in_parts(CaptureSpec(id="c", steps=5), "sampled")
    assert not records_in_parts(CaptureSpec(id="c", steps=5), "traced")
    assert not records_in_parts(CaptureSpec(id="c", steps=5, record_shapes=True), "traced")  # the tracer: one session
    for option in ("record_shapes", "with_flops", "profile_memory"):
        assert records_in_parts(CaptureSpec(id="c", steps=5, **{option: True}), "none"), option
    assert not records_in_parts(CaptureSpec(id="c", steps=1, record_shapes=True), "none")  # one step: one stop


def run(capture, steps):
    capture.begin(0)
    for n in range(steps):
        capture.on_step_begin(True, n)
        work()
        capture.on_step_end(True)


def captured(tmp_path, exporter, spec: CaptureSpec, steps: int):
    """Run ``steps`` steps of a capture of ``spec`` to its end: its raw trace's path and its last report."""
    reports = Reports()
    path = tmp_path / "raw" / "w.json"
    run(StepCapture(spec, str(path), reports, exporter), steps)
    assert reports.done.wait(20)
    return path, reports.messages[-1]


def test_a_capture_with_shapes_records_each_step_in_its_own_session_and_leaves_one_file(tmp_path, exporter):
    path, last = captured(tmp_path, exporter, CaptureSpec(id="c1", steps=3, record_shapes=True), 4)
    assert last.state == "done" and last.steps_recorded == 3, last
    events = json.loads(path.read_text())["traceEvents"]
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    # The shapes of every step, not only the first session's.
    mm = [e for e in events if e.get("name") == "aten::mm"]
    assert len(mm) == 3 and all(e["args"].get("Input Dims") == [[16, 16], [16, 16]] for e in mm), mm
    assert last.bytes == path.stat().st_size
    assert sorted(os.listdir(path.parent)) == ["w.json"], "the parts are deleted once joined"


def test_a_part_that_fails_to_export_fails_the_capture_and_no_part_is_left(tmp_path, exporter, monkeypatch):
    calls = []
    real = tp.profile.export_chrome_trace

    def export(self, out):
        calls.append(out)
        if len(calls) == 2:
            raise OSError("disk said no")
        return real(self, out)

    monkeypatch.setattr(tp.profile, "export_chrome_trace", export)
    path, last = captured(tmp_path, exporter, CaptureSpec(id="c2", steps=3, with_flops=True), 3)
    assert last.state == "failed" and "disk said no" in last.error, last
    assert calls == [part_path(str(path), k) for k in range(3)]
    assert not path.parent.exists() or os.listdir(path.parent) == []


def test_an_abandoned_capture_leaves_no_part_behind(tmp_path, exporter):
    reports = Reports()
    path = tmp_path / "raw" / "w.json"
    capture = StepCapture(CaptureSpec(id="c3", steps=5, profile_memory=True), str(path), reports, exporter)
    run(capture, 3)  # parts 0 and 1 exported, part 2 recording
    capture.abandon("profiler error on the step path: test")
    assert reports.done.wait(20)
    exporter.submit(lambda: None).result(10)  # after the discard queued behind the parts
    assert reports.messages[-1].state == "failed"
    assert not path.parent.exists() or os.listdir(path.parent) == []
