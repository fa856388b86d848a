"""The vLLM plugin's phase ranges (plugins/sidecar_vllm/phase_scopes.py) switched by a real StepCapture:
none is entered outside a capture, each is while it records, and nothing is left behind after.

The engine core here is a stand-in with the attributes ``EngineCore.step`` calls (its real step runs in
tests/e2e/test_vllm_anatomy.py); vLLM's own scope switch is vLLM's real ``v1/utils.py``."""

from __future__ import annotations

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch.autograd.profiler as autograd_profiler

from sidecar.analysis import analyze_path
from sidecar.probe.capture.profiler import StepCapture
from sidecar.common.protocol import CaptureSpec
from sidecar_vllm import phase_scopes
from sidecar_vllm.profile import VLLM_PROFILE

vllm_utils = pytest.importorskip("vllm.v1.utils")


class Scheduler:
    def schedule(self, *args):
        return "scheduler output"

    def update_from_output(self, scheduler_output, model_output):
        return {0: model_output}


class Executor:
    def execute_model(self, scheduler_output, non_block=False):
        return "future"


class Core:
    """What EngineCore.step touches, in its order."""

    def __init__(self):
        self.scheduler = Scheduler()
        self.model_executor = Executor()

    @contextlib.contextmanager
    def capture_iteration_details(self, scheduler_output):
        yield None

    def step(self):
        out = self.scheduler.schedule()
        self.model_executor.execute_model(out, non_block=True)
        with self.capture_iteration_details(out):
            # the worker's scopes, as the model runner enters them
            with vllm_utils.record_function_or_nullcontext("gpu_model_runner: forward"):
                model_output = sum(range(100))
        return self.scheduler.update_from_output(out, model_output)


@pytest.fixture
def entered(monkeypatch):
    """Every range name entered through torch's record_function, ours and vLLM's scopes alike."""
    names = []
    real = autograd_profiler.record_function

    class Counting(real):
        def __init__(self, name, *args):
            names.append(name)
            super().__init__(name, *args)

    monkeypatch.setattr(autograd_profiler, "record_function", Counting)
    # vLLM chooses its scope function once; make it choose again with the counting one visible
    monkeypatch.setattr(vllm_utils, "record_function", Counting)
    monkeypatch.setattr(vllm_utils, "_PROFILER_FUNC", None)
    return names


def run_steps(core, capture, steps, counter):
    for _ in range(steps):
        capture.on_step_begin(True, counter[0])
        core.step()
        counter[0] += 1
        capture.on_step_end(True)


def test_ranges_are_entered_only_while_a_capture_records(tmp_path, entered):
    core = Core()
    reports = []
    with ThreadPoolExecutor(1) as exporter:
        capture = StepCapture(CaptureSpec(id="c1", steps=3), str(tmp_path / "core.json"), reports.append, exporter,
                              phase_scopes=phase_scopes.engine_core_scopes(core),
                              phase_table=VLLM_PROFILE.phase_table())
        counter = [0]
        run_steps(core, capture, 4, counter)  # armed, not begun: idle as before
        assert entered == []
        assert vllm_utils._PROFILER_FUNC is contextlib.nullcontext
        capture.begin(counter[0])
        run_steps(core, capture, 3, counter)
        assert capture.finished
        per_step = ["sidecar: schedule", "sidecar: send to workers", "sidecar: wait for model",
                    "gpu_model_runner: forward", "sidecar: update from output"]
        # (torch's own ProfilerStep#n ranges go through record_function too)
        assert [n for n in entered if not n.startswith("ProfilerStep#")] == per_step * 3
        entered.clear()
        run_steps(core, capture, 4, counter)  # after the capture: nothing again
        assert entered == []
        exporter.shutdown(wait=True)
    # nothing left on the engine's objects: the class's own methods are found again
    assert "schedule" not in vars(core.scheduler) and "update_from_output" not in vars(core.scheduler)
    assert "execute_model" not in vars(core.model_executor) and "capture_iteration_details" not in vars(core)
    assert vllm_utils._PROFILER_FUNC is contextlib.nullcontext
    assert getattr(vllm_utils, "_inference_sidecar_scope_users") == 0

    # The trace holds the ranges and says which are phases: the analysis needs nothing else.
    trace = json.load(open(tmp_path / "core.json"))
    assert trace["inference_sidecar"]["phase_ranges"]["sidecar: schedule"] == "schedule"
    names = {e["name"] for e in trace["traceEvents"] if e.get("cat") == "user_annotation"}
    assert set(per_step) <= names
    core_anatomy = analyze_path(tmp_path / "core.json")["anatomy"]["processes"][0]
    assert set(core_anatomy["mean_us"]) == {"schedule", "dispatch", "wait_model", "forward", "update"}
    assert all(s["phases_us"]["schedule"] > 0 for s in core_anatomy["steps"])


def test_two_switches_in_one_process_leave_vllm_scopes_off_only_after_the_last(entered):
    core_switch, worker_switch = phase_scopes.engine_core_scopes(Core()), phase_scopes.worker_scopes()
    core_switch(True)
    worker_switch(True)
    core_switch(False)
    assert vllm_utils._PROFILER_FUNC is not contextlib.nullcontext and vllm_utils._PROFILER_FUNC is not None
    worker_switch(False)
    worker_switch(False)  # twice: no harm
    with vllm_utils.record_function_or_nullcontext("gpu_model_runner: forward"):
        pass
    assert entered == []


def test_a_switch_that_fails_costs_the_ranges_not_the_capture(tmp_path):
    def broken(on):
        raise RuntimeError("no scheduler here")

    reports = []
    with ThreadPoolExecutor(1) as exporter:
        capture = StepCapture(CaptureSpec(id="c2", steps=1), str(tmp_path / "w.json"), reports.append, exporter,
                              phase_scopes=broken)
        capture.begin(0)
        capture.on_step_begin(True, 0)
        capture.on_step_end(True)
        exporter.shutdown(wait=True)
    assert reports[-1].state == "done", reports[-1]
