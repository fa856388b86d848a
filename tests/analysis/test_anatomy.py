"""Step anatomy (sidecar/analysis/questions/anatomy.py) on hand-built traces whose every figure is known."""

from __future__ import annotations

import json
import re

import pytest

from sidecar.analysis import analyze_path, format_report

from .synth import kernel, op, process_name, runtime, step, write

CORE, WORKER, API = 10, 20, 5
TABLE = {
    "core: schedule": "schedule", "core: send": "dispatch", "core: wait": "wait_model", "core: update": "update",
    "w: preprocess": "prepare", "w: forward": "forward", "w: logits": "forward", "w: sample": "sample",
    "w: bookkeep": "sample", "api: in": "input", "api: out": "output",
    "something else": "not a phase",  # an unknown phase is ignored, not an error
}
NOTED = {"inference_sidecar": {"phase_ranges": TABLE}}


def ann(name, ts, dur, pid):
    return op(name, ts, dur, cat="user_annotation", pid=pid, tid=pid)


def core_events(last_dur=300, last_update=False):
    events = [process_name(CORE, "engine core (pid 10)")]
    for k in range(4):
        s = 1000.0 * k
        last = k == 3
        events.append(step(k, s, last_dur if last else 1000, pid=CORE, tid=CORE))
        events += [ann("core: schedule", s, 100, CORE), ann("core: schedule", s + 20, 30, CORE),  # nested: counted once
                   ann("core: send", s + 100, 20, CORE)]
        if not last:
            events += [ann("core: wait", s + 120, 680, CORE), ann("core: update", s + 800, 100, CORE)]
        else:
            events.append(ann("core: wait", s + 120, min(680, last_dur - 120), CORE))
            if last_update:
                events.append(ann("core: update", s + 800, 50, CORE))
    return events


def worker_events(gpu=False):
    events = [process_name(WORKER, "worker rank 0 (pid 20)")]
    for k in range(4):
        w = 1000.0 * k + 120
        last = k == 3
        events.append(step(k, w, 200 if last else 1000, pid=WORKER, tid=WORKER))
        events += [ann("w: preprocess", w + 10, 50, WORKER)]
        if last:  # the window ends inside the forward
            events.append(ann("w: forward", w + 60, 140, WORKER))
            continue
        events += [ann("w: forward", w + 60, 400, WORKER), ann("w: logits", w + 460, 40, WORKER),
                   ann("w: sample", w + 500, 60, WORKER), ann("w: bookkeep", w + 560, 20, WORKER)]
        if gpu:
            events += [runtime("cudaLaunchKernel", w + 100, 5, corr=k, pid=WORKER, tid=WORKER),
                       kernel("gemm", w + 150, 300, corr=k),
                       runtime("cudaLaunchKernel", w + 510, 5, corr=100 + k, pid=WORKER, tid=WORKER),
                       kernel("argmax", w + 520, 20, corr=100 + k)]
    return events


def api_events():
    return [process_name(API, "API server (pid 5)"),
            step(0, 0, 6000, pid=API, tid=API),  # torch's one step range over the window it records
            ann("api: in", 50, 30, API), ann("api: out", 950, 40, API), ann("api: in", 1500, 30, API),
            ann("api: out", 2950, 40, API), ann("api: out", 5000, 10, API)]  # the last: after every step


@pytest.fixture
def summary(tmp_path):
    path = write(tmp_path / "merged.json", core_events() + worker_events() + api_events(), **NOTED)
    return analyze_path(path)


def by_process(anatomy, label_part):
    return next(p for p in anatomy["processes"] if label_part in p["process"])


def test_each_phase_of_each_step_in_each_process(summary):
    anatomy = summary["anatomy"]
    core = by_process(anatomy, "engine core")
    assert [s["step"] for s in core["steps"]] == [0, 1, 2, 3]
    assert core["steps"][0]["phases_us"] == {"schedule": 100, "dispatch": 20, "wait_model": 680, "update": 100}
    assert core["steps"][0]["unphased_us"] == 100 and core["steps"][0]["wall_us"] == 1000
    worker = by_process(anatomy, "worker")
    # forward = the forward and the logits ranges; sample = sampling and bookkeeping
    assert worker["steps"][1]["phases_us"] == {"prepare": 50, "forward": 440, "sample": 80}
    assert worker["mean_us"] == {"prepare": 50, "forward": 440, "sample": 80}
    assert anatomy["phases"]["wait_model"] == "wait for the model"


def test_a_step_cut_off_at_the_end_of_the_window_is_partial_and_not_averaged(summary):
    anatomy = summary["anatomy"]
    for label in ("engine core", "worker"):
        p = by_process(anatomy, label)
        assert [s["partial"] for s in p["steps"]] == [False, False, False, True]
        assert (p["complete_steps"], p["partial_steps"]) == (3, 1)
    core = by_process(anatomy, "engine core")
    # Averaged in, the cut-off wait (180 µs) would pull the mean down from 680.
    assert core["steps"][3]["phases_us"]["wait_model"] == 180
    assert core["mean_us"]["wait_model"] == 680
    assert core["mean_us"]["update"] == 100  # not 75: the last step has none, and is left out
    assert "4 steps, 1.00 ms/step" in summary["headline"]  # the steps' own mean leaves them out too


def test_a_last_step_that_lacks_a_phase_every_other_has_is_partial(tmp_path):
    # 900 µs: long enough for the step-length rule, but the update never came.
    path = write(tmp_path / "core.json", core_events(last_dur=900), **NOTED)
    core = analyze_path(path)["anatomy"]["processes"][0]
    assert [s["partial"] for s in core["steps"]] == [False, False, False, True]
    path = write(tmp_path / "whole.json", core_events(last_dur=900, last_update=True), **NOTED)
    core = analyze_path(path)["anatomy"]["processes"][0]
    assert not any(s["partial"] for s in core["steps"])


def test_a_process_without_steps_is_cut_by_the_engine_steps(summary):
    api = by_process(summary["anatomy"], "API server")
    assert api["steps_of"] == "engine core (pid 10)"
    assert [s["phases_us"] for s in api["steps"]] == [
        {"input": 30, "output": 40}, {"input": 30, "output": 0}, {"input": 0, "output": 40}, {"input": 0, "output": 0}]
    assert api["mean_us"] == {"input": 20, "output": pytest.approx(26.667, abs=1e-3)}
    assert api["total_us"] == {"input": 60, "output": 90}  # the range after the last step counts in the total only


def test_host_time_between_two_forwards(summary):
    (between,) = summary["anatomy"]["between_forwards"]
    assert "worker" in between["process"]
    # step k-1's forward (with its logits) ends at W+500, step k's begins at W+1000+60
    assert [(r["step"], r["host_us"], r["partial"]) for r in between["steps"]] == [(1, 560, False), (2, 560, False), (3, 560, True)]
    assert between["mean_host_us"] == 560
    assert between["mean_device_idle_us"] is None  # no GPU kernels: the worker's own wait is the figure


def test_device_idle_between_forwards_on_a_gpu_trace(tmp_path):
    path = write(tmp_path / "gpu.json", core_events() + worker_events(gpu=True), **NOTED)
    (between,) = analyze_path(path)["anatomy"]["between_forwards"]
    # the forward's kernel ends at W+450; the next forward's starts at W+1000+150; the sampling kernel
    # (20 µs) ran in between
    assert [r["device_idle_us"] for r in between["steps"][:2]] == [680, 680]
    assert between["mean_device_idle_us"] == 680


def test_headline_and_report_name_the_largest_phase(summary):
    # wait_model (680 µs) is the engine core waiting for the worker: the largest is the worker's forward
    assert summary["anatomy"]["largest"] == {"process": "worker rank 0 (pid 20)", "phase": "forward",
                                             "label": "forward", "mean_us": 440}
    assert "largest phase forward (440 µs/step, worker rank 0 (pid 20))" in summary["headline"]
    text = format_report(summary)
    assert "== Step anatomy (mean per complete step; partial steps left out)" in text
    assert "Between two forwards in worker rank 0 (pid 20): 560.0 µs on the host (mean)" in text
    assert "Largest phase: forward in worker rank 0 (pid 20), 440.0 µs per step" in text


def test_a_trace_that_notes_no_phase_ranges_has_no_anatomy(tmp_path):
    path = write(tmp_path / "plain.json", core_events() + worker_events())
    summary = analyze_path(path)
    assert summary["anatomy"] is None
    assert "largest phase" not in summary["headline"]
    assert "Step anatomy" not in format_report(summary)


def test_every_anatomy_field_is_documented(summary, tmp_path):
    from .test_schema import DOCS, _keys

    documented = set(re.findall(r"`([a-z_A-Z]+)`", DOCS.read_text(encoding="utf-8")))
    gpu = analyze_path(write(tmp_path / "gpu.json", core_events() + worker_events(gpu=True), **NOTED))
    emitted = _keys(summary["anatomy"], set()) | _keys(gpu["anatomy"], set())
    assert not sorted(emitted - documented), "anatomy fields missing from docs/analysis.md"
    json.dumps(summary["anatomy"], allow_nan=False)  # strict JSON: no NaN, no numpy scalars
