"""The vLLM plugin's phase switch (plugins/sidecar_vllm/phase_scopes.py) under an nsys capture: the engine
core's ranges and vLLM's own worker scopes become NVTX ranges named by their phase, only while the window
is open, and vLLM's scope choice is its own again after. The engine core is the stand-in of
tests/test_phase_scopes_plugin.py; vLLM's scope switch is its real ``v1/utils.py``."""

from __future__ import annotations

import vllm.v1.utils as vllm_utils

from nsys_calls import RecordingCalls, balanced
from sidecar.common.protocol import CaptureSpec
from sidecar.probe.capture.nsys import NsysCapture
from sidecar_vllm import phase_scopes
from sidecar_vllm.profile import VLLM_PROFILE
from test_phase_scopes_plugin import Core


def test_the_engine_cores_and_vllms_scopes_become_nvtx_ranges_while_the_window_is_open(monkeypatch):
    monkeypatch.setattr(vllm_utils, "_PROFILER_FUNC", None)  # vLLM chooses again at its next scope
    core, calls, reports = Core(), RecordingCalls(), []
    # One process with both switches, as a single-process vLLM has: the core's and the worker's.
    table = {**VLLM_PROFILE.phase_table("engine_core"), **VLLM_PROFILE.phase_table("worker")}
    switch_core, switch_worker = phase_scopes.engine_core_scopes(core), phase_scopes.worker_scopes()

    def both(on, ranges=None):
        switch_core(on, ranges) if on else switch_core(False)
        switch_worker(on, ranges) if on else switch_worker(False)

    capture = NsysCapture(CaptureSpec(id="c", steps=2, backend="nsys"), reports.append, calls, None, both, table)
    core.step()  # before: nothing
    assert calls.calls == []
    capture.begin(0)
    for n in range(3):
        capture.on_step_begin(True, n)
        core.step()
        capture.on_step_end(True)
    pushed = [c[1] for c in calls.calls if c[0] == "push"]
    phases = ["schedule (sidecar: schedule)", "dispatch (sidecar: send to workers)",
              "wait_model (sidecar: wait for model)", "forward (gpu_model_runner: forward)",
              "update (sidecar: update from output)"]
    assert pushed == ["step 0", *phases, "step 1", *phases]  # the third step is after the window
    assert balanced(calls.calls) and calls.calls[0] == ("start",) and calls.calls[-1] == ("stop",)
    assert reports[-1].state == "done" and reports[-1].nsys["phase_ranges"] is True
    assert "schedule" not in core.scheduler.__dict__  # our wrappers gone
    assert getattr(vllm_utils, "_inference_sidecar_scope_users", 0) == 0
    count = len(calls.calls)
    core.step()  # after: nothing more
    assert len(calls.calls) == count
