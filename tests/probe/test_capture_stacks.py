"""Python stacks in a capture (issue 15): sampled on a thread of the probe's own, or torch's traced
stacks only where the role allows them; the report says which, per process. A sampling probe hands
its raw samples over beside its trace; the sidecar's export turns them into the trace's slices and
the summary (``finalize`` below runs it as the sidecar does), and a lost samples file never costs the
trace."""

import asyncio
import errno
import gzip
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.engine import API_SERVER, ENGINE_CORE, WORKER
from sidecar.stacks import sampler as stack_sampler
from sidecar.probe.capture.limits import ProbeLimits
from sidecar.probe.capture.profiler_options import WINDOW_MAX_STACK_HZ, stack_mode
from sidecar.probe.capture.profiler import StepCapture, WindowCapture
from sidecar.common.protocol import CaptureReport, CaptureSpec
from sidecar.service.export.disk_space import NO_SPACE
from sidecar.service.export.merge import FinalizeResult, finalize_capture
from sidecar.stacks.samples_file import read as read_samples
from sidecar.stacks.samples_file import samples_path

ID = "20260101-000000-abcdef"


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


@pytest.fixture(scope="module", autouse=True)
def warm_profiler():
    """torch.profiler's first start in a process imports torch._inductor and sets Kineto up (seconds
    on a loaded host, with work left running after it); a probe does that at start-up, on its link
    thread, before any capture. So does this module, before its captures."""
    import torch.profiler as tp

    prof = tp.profile(activities=[tp.ProfilerActivity.CPU])
    prof.start()
    prof.stop()


def raw_path(tmp_path: Path) -> Path:
    """Where a probe writes its trace: <its root>/captures/<id>/raw/<process>.json."""
    return tmp_path / "probe-root" / "captures" / ID / "raw" / f"engine_core-pid{os.getpid()}.json"


@dataclass
class Rec:
    """A capture's process record as the sidecar's export reads it, from a probe's done report."""

    raw_file: str | None
    stacks_file: str | None
    stacks: str
    stack_summary: dict[str, Any] | None
    state: str = "done"
    role: str = "engine_core"
    pid: int = os.getpid()
    rank: int | None = None
    step_driven: bool = True

    @property
    def label(self) -> str:
        return f"engine core (pid {self.pid})"

    @property
    def stem(self) -> str:
        return f"engine_core-pid{self.pid}"

    @property
    def sort_key(self) -> tuple:
        return (self.step_driven, False, 0, self.role, self.pid)


def finalize(tmp_path: Path, done: CaptureReport) -> tuple[FinalizeResult, Path]:
    """The sidecar's export of one process's done report (sidecar.service.export.merge)."""
    capture_dir = tmp_path / "traces" / "captures" / ID
    capture_dir.mkdir(parents=True, exist_ok=True)
    rec = Rec(done.file, done.stacks_file, done.stacks, done.stack_summary)
    return finalize_capture(capture_dir, [rec], max_bytes=1 << 30), capture_dir


def trace_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


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
    path = raw_path(tmp_path)
    capture = StepCapture(CaptureSpec(id=ID, steps=5, stacks="sampled", stack_hz=1000), str(path), reports,
                          exporter, stacks="sampled")
    run_steps(capture, 5)
    assert reports.done.wait(20)
    done = reports.last
    assert done.state == "done", done.error
    assert done.stacks == "sampled"
    # The probe hands its samples over raw, beside its trace, which it leaves as Kineto wrote it.
    assert done.stacks_file == samples_path(str(path)) and os.path.isfile(done.stacks_file)
    assert done.stack_summary is None
    assert not [e for e in trace_events(path) if e.get("cat") == "python_function"]
    assert done.bytes == path.stat().st_size
    # What the profiler's own calls cost the step thread, and the export its thread, are reported.
    assert 0 < done.step_thread_ms < 10_000 and done.export_ms is not None and done.export_ms > 0

    result, capture_dir = finalize(tmp_path, done)
    outcome = result.processes[f"engine_core-pid{os.getpid()}"]
    summary = outcome.stack_summary
    assert summary["samples"] >= 10 and summary["stop_reason"] is None
    # The planted function holds about 99 % of the step thread's time: it must be the top frame.
    assert summary["top_self"][0]["function"] == "planted_slow_scheduler_function", summary["top_self"][:3]
    assert summary["top_self"][0]["share"] > 0.5
    for trace in (capture_dir / outcome.file, capture_dir / result.trace_file):  # the process's file, the merged one
        events = trace_events(trace)
        sampled = [e for e in events if e.get("cat") == "python_function" and e.get("ph") == "X"]
        assert any(e["name"].startswith("planted_slow_scheduler_function (") for e in sampled)
        # On the profiler's clock: the samples lie within the recorded ProfilerStep annotations.
        steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
        lo = min(e["ts"] for e in steps)
        hi = max(e["ts"] + e["dur"] for e in steps)
        assert all(lo - 1000 <= e["ts"] and e["ts"] + e["dur"] <= hi + 1000 for e in sampled)  # within 1 ms
    # The summary's python_stacks section and the headline name it, as before.
    analysed = json.loads((capture_dir / result.summary_file).read_text())
    [entry] = analysed["python_stacks"].values()
    assert entry["stacks"] == "sampled" and entry["top_self"][0]["function"] == "planted_slow_scheduler_function"
    assert "python: engine core" in result.headline and "planted_slow_scheduler_function" in result.headline
    # The raw trace and the samples are gone with the raw folder.
    assert not path.exists() and not os.path.exists(done.stacks_file)


def test_no_stacks_no_sampler_no_python_events(tmp_path, exporter):
    reports = Reports()
    path = tmp_path / "engine_core.json"
    capture = StepCapture(CaptureSpec(id="c1", steps=2), str(path), reports, exporter)
    before = {t.name for t in threading.enumerate()}
    run_steps(capture, 2)
    assert reports.done.wait(20)
    assert reports.last.stacks == "none" and reports.last.stack_summary is None
    assert reports.last.stacks_file is None and os.listdir(tmp_path) == ["engine_core.json"]
    assert not any(name.startswith("inference-sidecar-stacks") for name in {t.name for t in threading.enumerate()} - before)
    events = json.loads(path.read_text())["traceEvents"]
    assert not [e for e in events if e.get("cat") == "python_function"]


def test_sampler_bound_stops_stacks_not_the_capture(tmp_path, exporter):
    """A byte bound reached while sampling ends the samples early; the steps are still recorded and
    the report says why the stacks stopped."""
    reports = Reports()
    path = raw_path(tmp_path)
    capture = StepCapture(CaptureSpec(id=ID, steps=3, stacks="sampled"), str(path), reports, exporter,
                          limits=ProbeLimits(max_trace_mb=100), stacks="sampled")
    capture._sampler.max_bytes = 300  # white-box: a bound the first slices exceed
    run_steps(capture, 3)
    assert reports.done.wait(20)
    done = reports.last
    assert done.state == "done" and done.steps_recorded == 3
    result, capture_dir = finalize(tmp_path, done)
    outcome = result.processes[f"engine_core-pid{os.getpid()}"]
    assert outcome.stack_summary["stop_reason"] == "max_bytes reached"
    stops = [e for e in trace_events(capture_dir / outcome.file) if e.get("ph") == "i" and e.get("cat") == "python_function"]
    assert len(stops) == 1 and "max_bytes reached" in stops[0]["name"]


def check_stacks_lost(tmp_path: Path, done: CaptureReport, path: Path, why: str) -> None:
    """The capture is done with its whole trace; the stacks are lost, the report says why, and no
    samples file is left behind."""
    assert done.state == "done", done.error
    assert done.stacks == "sampled" and done.stacks_file is None
    assert done.stack_summary["error"].startswith("python stacks not saved: ") and why in done.stack_summary["error"]
    assert not os.path.exists(samples_path(str(path)))
    assert any(str(e.get("name", "")).startswith("ProfilerStep#") for e in trace_events(path))
    assert done.bytes == path.stat().st_size
    result, capture_dir = finalize(tmp_path, done)
    outcome = result.processes[f"engine_core-pid{os.getpid()}"]
    assert outcome.error is None and outcome.file and result.trace_file
    summary = json.loads((capture_dir / result.summary_file).read_text())
    assert why in next(iter(summary["python_stacks"].values()))["error"]


def test_a_full_disk_on_the_samples_dump_loses_the_stacks_not_the_trace(tmp_path, exporter, monkeypatch):
    def dump(self, path, timeout=2.0):
        with open(path, "wb") as f:  # the disk filled part way through
            f.write(b"\x8f\xa6format")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(stack_sampler.StackSampler, "dump", dump)
    reports = Reports()
    path = raw_path(tmp_path)
    capture = StepCapture(CaptureSpec(id=ID, steps=2, stacks="sampled"), str(path), reports, exporter,
                          stacks="sampled")
    run_steps(capture, 2)
    assert reports.done.wait(20)
    check_stacks_lost(tmp_path, reports.last, path, NO_SPACE)


def test_a_samples_file_over_the_byte_limit_is_deleted_and_the_trace_kept(tmp_path, exporter, monkeypatch):
    real = ProbeLimits.samples_problem
    sizes = []

    def just_under(self, trace_size, samples_size):  # a limit the trace fits and the two together do not
        sizes.append((trace_size, samples_size))
        return real(ProbeLimits(max_trace_mb=(trace_size + samples_size - 1) / 2**20), trace_size, samples_size)

    monkeypatch.setattr(ProbeLimits, "samples_problem", just_under)
    reports = Reports()
    path = raw_path(tmp_path)
    capture = StepCapture(CaptureSpec(id=ID, steps=2, stacks="sampled"), str(path), reports, exporter,
                          limits=ProbeLimits(), stacks="sampled")
    run_steps(capture, 2)
    assert reports.done.wait(20)
    [(trace_size, samples_size)] = sizes
    assert trace_size == path.stat().st_size and samples_size > 0
    check_stacks_lost(tmp_path, reports.last, path, "SIDECAR_PROBE_MAX_TRACE_MB")


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
    assert reports.last.stacks == "traced" and reports.last.stack_summary is None and reports.last.stacks_file is None
    events = json.loads(path.read_text())["traceEvents"]
    assert any(e.get("cat") == "python_function" for e in events)  # torch's tracer recorded Python calls


def busy_event_loop_callback(seconds: float) -> None:
    """Pure Python on the event loop, as an API server's token streaming is."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


@pytest.mark.parametrize("asked_hz, sampled_hz", [(1000.0, WINDOW_MAX_STACK_HZ), (20.0, 20.0)])
def test_window_capture_samples_its_event_loop_at_a_capped_rate(tmp_path, exporter, asked_hz, sampled_hz):
    """The API server's capture samples its event loop's thread at most WINDOW_MAX_STACK_HZ times a
    second (each sample forces the loop to hand over the GIL: sidecar/probe/capture/profiler.py), a lower rate as asked;
    the samples file says the rate used, and the loop's own function is in the samples."""
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    try:
        reports = Reports()
        path = tmp_path / "probe-root" / "captures" / ID / "raw" / f"api_server-pid{os.getpid()}.json"
        path.parent.mkdir(parents=True)
        spec = CaptureSpec(id=ID, steps=5, stacks="sampled", stack_hz=asked_hz)
        capture = WindowCapture(spec, str(path), reports, exporter, loop, stacks="sampled")
        capture.start_window()
        for _ in range(8):  # about 0.8 s of a busy loop, in callbacks as a server's are
            loop.call_soon_threadsafe(busy_event_loop_callback, 0.1)
        time.sleep(1.0)
        capture.request_stop("done")
        assert reports.done.wait(20)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
        loop.close()
    done = reports.last
    assert done.state == "done", done.error
    samples = read_samples(done.stacks_file)
    assert samples.raw.hz == sampled_hz and samples.raw.thread_id == loop_thread.ident
    assert 0 < len(samples) <= sampled_hz * 3  # at most the capped rate over the window (< 3 s here)
    names = {samples.raw.frames[f][0] for stack in samples.stacks for f in stack}
    assert "busy_event_loop_callback" in names, sorted(names)[:20]
