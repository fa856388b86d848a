"""An nsys capture in one process (sidecar/probe/capture/nsys.py), its CUDA profiler and NVTX calls recorded
by a stand-in (tests/nsys_calls.py): cudaProfilerStart at the aligned start step, one balanced NVTX range
per step and per phase while the window is open and none outside it, cudaProfilerStop after N working
steps, and after an early stop, the time limit or an error on the step path too."""

from __future__ import annotations

import pytest

from nsys_calls import RecordingCalls, balanced
from sidecar.common.protocol import CaptureReport, CaptureSpec
from sidecar.integration.method_ranges import MethodRanges
from sidecar.probe.capture.limits import ProbeLimits
from sidecar.probe.capture.nsys import NsysCapture, phase_range_name

TABLE = {"engine: schedule": "schedule", "engine: forward": "forward"}


class Engine:
    def schedule(self):
        return "scheduled"

    def forward(self):
        return "forwarded"


class Loop:
    """A step loop: the probe's count of working steps, and the engine's phases inside each step."""

    def __init__(self, capture, engine=None):
        self.capture, self.engine, self.steps = capture, engine, 0

    def step(self, has_work=True):
        self.capture.on_step_begin(has_work, self.steps)
        if has_work and self.engine is not None:
            self.engine.schedule()
            self.engine.forward()
        if has_work:
            self.steps += 1
        self.capture.on_step_end(has_work)


def make(steps=3, calls=None, phases=True, limits=None):
    reports: list[CaptureReport] = []
    calls = calls or RecordingCalls()
    engine = Engine()
    switch = MethodRanges(lambda: [(engine, "schedule", "engine: schedule"), (engine, "forward", "engine: forward")])
    capture = NsysCapture(CaptureSpec(id="c1", steps=steps, backend="nsys"), reports.append, calls, limits,
                          switch if phases else None, TABLE)
    return capture, Loop(capture, engine), calls, reports, engine


def test_start_at_the_aligned_step_ranges_per_step_and_phase_stop_after_n():
    capture, loop, calls, reports, engine = make(steps=2)
    for _ in range(3):
        loop.step()  # armed, no begin yet: nothing called
    assert calls.calls == [] and capture.state == "armed"
    capture.begin(5)
    loop.step()
    loop.step()  # working steps 3 and 4: before the start step
    assert calls.calls == []
    loop.step(has_work=False)  # an idle step at 5: the window opens at the first working step >= 5
    assert calls.calls == []
    loop.step()
    loop.step(has_work=False)  # inside the window: not a working step, no step range
    loop.step()
    loop.step()  # after the window: nothing
    assert calls.calls == [
        ("start",),
        ("push", "step 5"), ("push", "schedule (engine: schedule)"), ("pop",),
        ("push", "forward (engine: forward)"), ("pop",), ("pop",),
        ("push", "step 6"), ("push", "schedule (engine: schedule)"), ("pop",),
        ("push", "forward (engine: forward)"), ("pop",), ("pop",),
        ("stop",),
    ]
    assert balanced(calls.calls)
    assert "schedule" not in engine.__dict__ and "forward" not in engine.__dict__  # switched off: no wrapper left
    assert [r.state for r in reports] == ["capturing", "exporting", "done"]
    done = reports[-1]
    assert done.steps_recorded == 2 and done.first_step == 5 and done.file is None
    assert done.nsys == {"cuda_profiler": True, "step_ranges": 2, "phase_ranges": True}


@pytest.mark.parametrize("how", ["stop request", "time limit", "error on the step path"])
def test_an_early_end_still_pops_every_range_and_stops_the_profiler(how, monkeypatch):
    limits = ProbeLimits(max_capture_s=0.0) if how == "time limit" else None
    capture, loop, calls, reports, _ = make(steps=10, limits=limits)
    capture.begin(0)
    loop.step()
    if how == "stop request":
        capture.request_stop("stopped by request")
        loop.step()  # the next step boundary closes it
    elif how == "error on the step path":
        capture.on_step_begin(True, loop.steps)  # a step that begins, then the probe gives up in it
        capture.abandon("profiler error on the step path: boom")
    assert calls.calls[0] == ("start",) and calls.calls[-1] == ("stop",)
    assert calls.calls.count(("stop",)) == 1 and balanced(calls.calls)
    final = reports[-1]
    if how == "error on the step path":
        assert final.state == "failed" and "boom" in final.error
    else:
        assert final.state == "done" and final.steps_recorded == 1
        assert final.stop_reason == ("stopped by request" if how == "stop request" else limits.duration_reason)
    count = len(calls.calls)
    loop.step()
    assert len(calls.calls) == count  # closed: nothing more


def test_cancelled_before_its_step_calls_nothing():
    capture, loop, calls, reports, _ = make()
    capture.begin(100)
    loop.step()
    assert capture.request_stop("stopped by request") is True
    assert calls.calls == [] and reports[-1].state == "failed"


def test_a_process_without_a_cuda_context_marks_its_steps_but_never_starts_the_profiler():
    capture, loop, calls, reports, _ = make(steps=1, calls=RecordingCalls(has_context=False), phases=False)
    capture.begin(0)
    loop.step()
    assert calls.calls == [("push", "step 0"), ("pop",)]
    assert reports[-1].nsys == {"cuda_profiler": False, "step_ranges": 1, "phase_ranges": False}


def test_a_phase_switch_that_takes_no_ranges_costs_the_phases_not_the_steps():
    calls, reports = RecordingCalls(), []
    switched = []
    capture = NsysCapture(CaptureSpec(id="c2", steps=1, backend="nsys"), reports.append, calls, None,
                          switched.append, TABLE)  # an engine's switch of the old kind: (on) only
    capture.begin(0)
    Loop(capture).step()
    assert calls.calls == [("start",), ("push", "step 0"), ("pop",), ("stop",)]
    assert switched == []  # never switched on with torch's ranges instead
    assert reports[-1].state == "done" and reports[-1].nsys["phase_ranges"] is False
    assert "takes no ranges=" in reports[-1].nsys["phase_note"]


def test_a_failing_stop_fails_the_process_after_the_rest_is_undone():
    capture, loop, calls, reports, engine = make(steps=1, calls=RecordingCalls(fail_on="stop"))
    capture.begin(0)
    loop.step()
    assert reports[-1].state == "failed" and "stop failed" in reports[-1].error
    assert balanced(calls.calls) and "schedule" not in engine.__dict__


def test_a_phase_switch_that_fails_half_way_is_switched_off_again():
    engine = Engine()
    ranges = MethodRanges(lambda: [(engine, "schedule", "engine: schedule"), (None, "x", "y"), 42])  # 42: not a target
    calls, reports = RecordingCalls(), []
    capture = NsysCapture(CaptureSpec(id="c3", steps=1, backend="nsys"), reports.append, calls, None, ranges, TABLE)
    capture.begin(0)
    Loop(capture, engine).step()
    assert "schedule" not in engine.__dict__ and not ranges.on  # the wrapper that went in came out
    assert reports[-1].state == "done" and "phase ranges not switched on" in reports[-1].nsys["phase_note"]
    assert calls.calls == [("start",), ("push", "step 0"), ("pop",), ("stop",)]


def test_phase_range_names():
    assert phase_range_name("gpu_model_runner: forward", {"gpu_model_runner: forward": "forward"}) == \
        "forward (gpu_model_runner: forward)"
    assert phase_range_name("other", {}) == "other"
