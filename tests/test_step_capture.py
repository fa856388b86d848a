"""StepCapture against the real torch.profiler, driven by a simulated step loop."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sidecar.probe.capture.profiler import StepCapture
from sidecar.common.protocol import CaptureReport, CaptureSpec


class Reports:
    def __init__(self):
        self.messages = []
        self.done = threading.Event()

    def __call__(self, msg):
        assert isinstance(msg, CaptureReport)
        self.messages.append(msg)
        if msg.state in ("done", "failed"):
            self.done.set()

    @property
    def states(self):
        return [m.state for m in self.messages]


@pytest.fixture
def exporter():
    with ThreadPoolExecutor(1) as pool:
        yield pool


def work():
    x = torch.randn(16, 16)
    return (x @ x).sum()


class Counter:
    """The probe's count of working steps, which on_step_begin receives as the step index."""

    steps = 0


def step(capture, has_work=True, counter=Counter):
    capture.on_step_begin(has_work, counter.steps)
    if has_work:
        work()
        counter.steps += 1
    capture.on_step_end(has_work)


@pytest.fixture(autouse=True)
def reset_counter():
    Counter.steps = 0


def profiler_steps(path):
    events = json.load(open(path))["traceEvents"]
    return sorted(e["name"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))


def test_records_exactly_n_working_steps_and_skips_empty_ones(tmp_path, exporter):
    reports = Reports()
    spec = CaptureSpec(id="c1", steps=3)
    capture = StepCapture(spec, str(tmp_path / "w.json"), reports, exporter)
    step(capture)  # armed but not begun: the sidecar has not chosen the start step yet
    assert capture.state == "armed"
    capture.begin(1)
    step(capture, has_work=False)  # an idle step: does not start the capture
    assert capture.state == "armed"
    for has_work in (True, False, True, False, True, True, True):
        step(capture, has_work)
    assert reports.done.wait(10)
    assert reports.states == ["capturing", "exporting", "done"]
    assert reports.messages[-1].steps_recorded == 3
    assert reports.messages[-1].first_step == 1
    assert profiler_steps(tmp_path / "w.json") == ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"]
    assert capture.finished


def test_starts_at_the_common_start_step_or_the_next_if_it_passed(tmp_path, exporter):
    reports = Reports()
    capture = StepCapture(CaptureSpec(id="c2", steps=2), str(tmp_path / "w.json"), reports, exporter)
    capture.begin(3)
    for _ in range(3):
        step(capture)
        assert capture.state == "armed"
    step(capture)
    assert capture.state == "recording" and capture.first_step == 3
    step(capture)
    assert reports.done.wait(10)
    assert len(profiler_steps(tmp_path / "w.json")) == 2

    late = StepCapture(CaptureSpec(id="c2b", steps=1), str(tmp_path / "l.json"), Reports(), exporter)
    late.begin(1)  # step 1 already passed in this process (counter is at 5)
    step(late)
    assert late.first_step == 5


def test_a_step_that_announced_work_and_did_none_opens_no_profiler_step(tmp_path, exporter):
    reports = Reports()
    capture = StepCapture(CaptureSpec(id="c7", steps=2), str(tmp_path / "w.json"), reports, exporter)
    capture.begin(0)
    for did_work in (False, False, True, False, True):  # every step announced work; two did some
        capture.on_step_begin(True, Counter.steps)
        if did_work:
            work()
            Counter.steps += 1
        capture.on_step_end(did_work)
    assert reports.done.wait(10)
    assert (reports.messages[-1].first_step, reports.messages[-1].steps_recorded) == (0, 2)
    assert profiler_steps(tmp_path / "w.json") == ["ProfilerStep#0", "ProfilerStep#1"]


def test_stop_before_start_fails_without_touching_the_profiler(tmp_path, exporter):
    reports = Reports()
    capture = StepCapture(CaptureSpec(id="c3", steps=2), str(tmp_path / "w.json"), reports, exporter)
    assert capture.request_stop("timeout") is True
    assert capture.finished and reports.states == ["failed"]
    assert "timeout" in reports.messages[0].error
    step(capture)  # later steps are no-ops
    assert reports.states == ["failed"] and not (tmp_path / "w.json").exists()


def test_stop_while_recording_keeps_what_was_recorded(tmp_path, exporter):
    reports = Reports()
    capture = StepCapture(CaptureSpec(id="c4", steps=10), str(tmp_path / "w.json"), reports, exporter)
    capture.begin(0)
    step(capture)
    step(capture)
    assert capture.request_stop("stopped by request") is False  # only the step thread may stop torch
    assert capture.state == "recording"
    step(capture)  # the next step boundary ends it
    assert reports.done.wait(10)
    assert reports.messages[-1].state == "done"
    assert reports.messages[-1].steps_recorded == 2
    assert reports.messages[-1].stop_reason == "stopped by request"
    assert len(profiler_steps(tmp_path / "w.json")) == 2


def test_export_failure_is_reported_not_raised(tmp_path, exporter):
    reports = Reports()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    capture = StepCapture(CaptureSpec(id="c5", steps=1), str(blocker / "w.json"), reports, exporter)
    capture.begin(0)
    step(capture)
    assert reports.done.wait(10)
    assert reports.messages[-1].state == "failed"
    assert "export failed" in reports.messages[-1].error


def test_a_profiler_error_on_the_step_path_never_reaches_the_engine(tmp_path, exporter):
    from sidecar.probe.probe import Probe

    probe = Probe("worker", 0, endpoint="http://127.0.0.1:9", cuda_available=False)  # never started: no link
    reports = Reports()
    capture = StepCapture(CaptureSpec(id="c6", steps=5), str(tmp_path / "w.json"), reports, exporter)
    probe._capture = capture
    capture.begin(0)
    probe.step_begin(True)
    probe.step_end(True)
    assert capture.state == "recording"

    def broken_step():
        raise RuntimeError("kineto exploded")

    capture._prof.step = broken_step
    probe.step_begin(True)  # must not raise
    probe.step_end(True)
    assert probe._capture is None and capture.finished
    assert reports.messages[-1].state == "failed" and "kineto exploded" in reports.messages[-1].error
    assert probe.steps == 2
