"""Python stacks in a capture (issue 15): sampled on a thread of the probe's own, or torch's traced
stacks only where the role allows them; the report says which, per process."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sidecar.engine import API_SERVER, ENGINE_CORE, WORKER
from sidecar.probe.limits import ProbeLimits
from sidecar.probe.recorder import StepCapture, stack_mode
from sidecar.protocol import CaptureReport, CaptureSpec


class Reports:
    def __init__(self):
        self.messages: list[CaptureReport] = []
        self.done = threading.Event()

    def __call__(self, msg):
        self.messages.append(msg)
        if msg.state in ("done", "failed"):
            self.done.set()

    @property
    def last(self) -> CaptureReport:
        return self.messages[-1]


@pytest.fixture
def exporter():
    with ThreadPoolExecutor(1) as pool:
        yield pool


def planted_slow_scheduler_function():
    """Pure Python for about 20 ms: what a slow scheduler line looks like to the sampler."""
    end = time.perf_counter() + 0.02
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def quick_bookkeeping():
    return sum(range(200))


def run_steps(capture, steps):
    capture.begin(0)
    for i in range(steps):
        capture.on_step_begin(True, i)
        planted_slow_scheduler_function()
        quick_bookkeeping()
        capture.on_step_end(True)


@pytest.mark.parametrize("asked, role, recorded", [
    ("none", ENGINE_CORE, "none"),
    ("sampled", ENGINE_CORE, "sampled"),
    ("sampled", WORKER, "sampled"),
    ("traced", WORKER, "traced"),  # a model runner: torch's tracer is allowed
    ("traced", ENGINE_CORE, "sampled"),  # a scheduler: never torch's tracer (13 s stall)
    ("traced", API_SERVER, "sampled"),
])
def test_stack_mode_per_role(asked, role, recorded):
    assert stack_mode(CaptureSpec(id="c1", steps=1, stacks=asked), role) == recorded


def test_sampled_stacks_land_in_the_trace_and_name_the_slow_function(tmp_path, exporter):
    reports = Reports()
    path = tmp_path / "engine_core.json"
    capture = StepCapture(CaptureSpec(id="c1", steps=5, stacks="sampled", stack_hz=1000), str(path), reports,
                          exporter, stacks="sampled")
    run_steps(capture, 5)
    assert reports.done.wait(20)
    done = reports.last
    assert done.state == "done", done.error
    assert done.stacks == "sampled"
    summary = done.stack_summary
    assert summary["samples"] >= 10 and summary["stop_reason"] is None
    # The planted function holds about 99 % of the step thread's time: it must be the top frame.
    assert summary["top_self"][0]["function"] == "planted_slow_scheduler_function"
    assert summary["top_self"][0]["share"] > 0.5
    trace = json.loads(path.read_text())
    sampled = [e for e in trace["traceEvents"] if e.get("cat") == "python_function" and e.get("ph") == "X"]
    assert any(e["name"].startswith("planted_slow_scheduler_function (") for e in sampled)
    # On the profiler's clock: the samples lie within the recorded ProfilerStep annotations.
    steps = [e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    assert all(lo - 1000 <= e["ts"] and e["ts"] + e["dur"] <= hi + 1000 for e in sampled)  # within 1 ms
    assert done.bytes == path.stat().st_size
    # What the profiler's own calls cost the step thread, and the export its thread, are reported.
    assert 0 < done.step_thread_ms < 10_000 and done.export_ms is not None and done.export_ms > 0


def test_no_stacks_no_sampler_no_python_events(tmp_path, exporter):
    reports = Reports()
    path = tmp_path / "engine_core.json"
    capture = StepCapture(CaptureSpec(id="c1", steps=2), str(path), reports, exporter)
    before = {t.name for t in threading.enumerate()}
    run_steps(capture, 2)
    assert reports.done.wait(20)
    assert reports.last.stacks == "none" and reports.last.stack_summary is None
    assert not any(name.startswith("inference-sidecar-stacks") for name in {t.name for t in threading.enumerate()} - before)
    events = json.loads(path.read_text())["traceEvents"]
    assert not [e for e in events if e.get("cat") == "python_function"]


def test_sampler_bound_stops_stacks_not_the_capture(tmp_path, exporter):
    """A byte bound reached while sampling ends the samples early; the steps are still recorded and
    the report says why the stacks stopped."""
    reports = Reports()
    path = tmp_path / "engine_core.json"
    capture = StepCapture(CaptureSpec(id="c1", steps=3, stacks="sampled"), str(path), reports, exporter,
                          limits=ProbeLimits(max_trace_mb=100), stacks="sampled")
    capture._sampler.max_bytes = 300  # white-box: a bound the first slices exceed
    run_steps(capture, 3)
    assert reports.done.wait(20)
    done = reports.last
    assert done.state == "done" and done.steps_recorded == 3
    assert done.stack_summary["stop_reason"] == "max_bytes reached"


def test_cancelled_capture_ends_its_sampler_thread(tmp_path, exporter):
    reports = Reports()
    capture = StepCapture(CaptureSpec(id="c9", steps=3, stacks="sampled"), str(tmp_path / "x.json"), reports,
                          exporter, stacks="sampled")
    thread = capture._sampler._thread
    assert capture.request_stop("user") is True
    thread.join(5)
    assert not thread.is_alive()
    assert reports.last.state == "failed"


def test_traced_stacks_use_torch_with_stack_in_an_allowed_role(tmp_path, exporter):
    reports = Reports()
    path = tmp_path / "worker.json"
    capture = StepCapture(CaptureSpec(id="c1", steps=2, stacks="traced"), str(path), reports, exporter,
                          stacks="traced")
    assert capture._sampler is None
    run_steps(capture, 2)
    assert reports.done.wait(30)
    assert reports.last.stacks == "traced" and reports.last.stack_summary is None
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("cat") == "python_function" for e in events)  # torch's tracer recorded Python calls
