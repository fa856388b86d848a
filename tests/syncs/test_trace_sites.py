"""Trace-based detection on the recorded GPU traces in ../shared/traces (real A100 / MI250 runs):
each synchronize call and blocking copy becomes a site in the live detector's report model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar import engine
from sidecar.analysis import analyze_path
from sidecar.syncs import AllowEntry, Allowlist
from sidecar.syncs.report import merge_reports, merge_sites
from sidecar.analysis.sync_sites import scan_trace, skip_prefixes, trace_op, trace_site

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def trace(name: str) -> Path:
    path = TRACES / name
    assert path.exists(), f"recorded trace {path} missing (the shared/ folder beside the repository)"
    return path


def by_api(report):
    return {(s["op"], s["api"]): s for s in report["sites"]}


def assert_idle_is_the_gaps(report_or_sites, path) -> None:
    """The GPU idle time a trace scan gives its syncs is the idle time the analysis' gap causes give them."""
    sites = report_or_sites["sites"] if isinstance(report_or_sites, dict) else list(report_or_sites)
    caused = analyze_path(path)["gaps"]["by_cause"]["sync"]["total_us"]
    assert sum(s["gpu_idle_after_us"] for s in sites) == pytest.approx(caused, abs=0.1 * len(sites))


def test_item_event_and_device_syncs_on_a100():
    report = scan_trace(trace("a100-cuda-event-sync.json.gz"))
    sites = by_api(report)
    # `if t:` on a CUDA tensor: a DtoH copy into pageable memory, then a stream sync, both under
    # aten::is_nonzero → item → _local_scalar_dense.
    # The trace's last call, a top-level cudaDeviceSynchronize, is torch.profiler's own at stop: no site.
    assert set(sites) == {
        ("bool", "cudaMemcpyAsync"), ("bool", "cudaStreamSynchronize"),
        ("event.synchronize", "cudaEventSynchronize"),
    }
    copy = sites[("bool", "cudaMemcpyAsync")]
    assert (copy["kind"], copy["cpu_op"], copy["count"]) == ("pageable_copy", "aten::_local_scalar_dense", 1)
    assert copy["blocked_us"] > 0
    assert_idle_is_the_gaps(report, trace("a100-cuda-event-sync.json.gz"))
    assert all(s["classification"] == "hidden" and s["phase"] == "other" for s in report["sites"])
    assert len(report["processes"]) == 1
    json.dumps(report)


def test_rocm_blocking_copies():
    sites = by_api(scan_trace(trace("mi250-rocm-toy.json.gz")))
    assert set(sites) == {("copy_to_host", "hipMemcpyWithStream")}  # its hipDeviceSynchronize: the profiler's stop
    copy = sites[("copy_to_host", "hipMemcpyWithStream")]
    assert (copy["kind"], copy["count"], copy["cpu_op"]) == ("blocking_copy", 2, "aten::copy_")
    assert_idle_is_the_gaps(sites.values(), trace("mi250-rocm-toy.json.gz"))


def test_event_syncs_attributed_to_the_annotation_above_them():
    sites = by_api(scan_trace(trace("a100-nccl-multistream.json.gz")))
    event = sites[("event.synchronize", "cudaEventSynchronize")]
    assert event["function"] == "DistributedDataParallel.forward" and event["path"] == ""
    assert (event["count"], event["first_step"], event["last_step"]) == (24, 4, 6)
    assert event["count_per_step"] == 8.0


def test_allowlist_applies_to_trace_sites():
    sites = by_api(scan_trace(trace("a100-nccl-multistream.json.gz")))
    assert sites[("event.synchronize", "cudaEventSynchronize")]["classification"] == "hidden"
    # Without stacks a trace site has no file: an entry for "*" and the function matches it.
    allowlist = Allowlist([AllowEntry("*", function="DistributedDataParallel.forward", reason="DDP")])
    sites = by_api(scan_trace(trace("a100-nccl-multistream.json.gz"), allowlist=allowlist))
    event = sites[("event.synchronize", "cudaEventSynchronize")]
    assert (event["classification"], event["reason"]) == ("expected", "DDP")
    # Every other site stays hidden (the trace's top-level cudaDeviceSynchronize is the profiler's stop: none)
    assert all(s["classification"] == "hidden" for key, s in sites.items() if key != ("event.synchronize", "cudaEventSynchronize"))
    assert ("synchronize", "cudaDeviceSynchronize") not in sites


def test_a_trace_without_device_work_has_no_sites():
    assert scan_trace(trace("cpu-only-tiny.json.gz"))["sites"] == []


def test_python_frames_give_file_and_line():
    stack = (
        "vllm/v1/worker/gpu_worker.py(610): execute_model",
        "/venv/lib/python3.11/site-packages/vllm/v1/worker/gpu_model_runner.py(3630): _model_forward",
        "/srv/models/mymodel.py(88): forward",
        "/venv/lib/python3.11/site-packages/torch/_tensor.py(1200): __bool__",
        "aten::is_nonzero",
        "aten::item",
        "aten::_local_scalar_dense",
    )
    assert trace_site(stack) == {"file": "/srv/models/mymodel.py", "path": "/srv/models/mymodel.py", "line": 88, "function": "forward"}
    assert trace_op("cudaStreamSynchronize", "sync", stack) == ("bool", "aten::_local_scalar_dense")
    assert trace_op("cudaMemcpyAsync", "pageable_copy", ("aten::to", "aten::_to_copy", "aten::copy_")) == (
        "copy_to_pageable_non_blocking", "aten::copy_")
    assert trace_op("cudaStreamSynchronize", "sync", ()) == ("stream.synchronize", "")
    assert trace_site(("sidecar/probe/probe.py(80): step_begin",)) == {"file": "", "path": "", "line": 0, "function": ""}


# -- an engine's trace with Python stacks: the profile names phases, expected sites and skipped frames --
SP = "/venv/lib/python3.11/site-packages/"


def _x(cat, name, ts, dur, pid, args=None):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": 1, "ts": ts, "dur": dur, "args": args or {}}


def _step(pid, device, n, t0, corr, with_event_sync=False):
    """One engine step as vLLM's worker runs it, recorded with_stack: an ``if t:`` in the model, the
    sampled-token transfer, a scheduler sync, and a sync inside the plugin's own hook wrapper."""
    py = lambda frame, ts, dur: _x("python_function", frame, t0 + ts, dur, pid)  # noqa: E731
    rt = lambda name, ts, dur, c: _x("cuda_runtime", name, t0 + ts, dur, pid, {"correlation": corr + c})  # noqa: E731
    gpu = lambda name, ts, dur, c, cat="kernel": {  # noqa: E731
        "ph": "X", "cat": cat, "name": name, "pid": device, "tid": 7, "ts": t0 + ts, "dur": dur,
        "args": {"device": device, "stream": 7, "correlation": corr + c}}
    events = [
        _x("user_annotation", f"ProfilerStep#{n}", t0, 1000, pid),
        py(SP + "vllm/v1/worker/gpu_worker.py(610): execute_model", 10, 900),
        py(SP + "sidecar_vllm/hooks.py(50): wrapper", 11, 890),
        py(SP + "vllm/v1/worker/gpu_model_runner.py(3630): _model_forward", 20, 300),
        py("/srv/models/mymodel.py(88): forward", 30, 200),
        py(SP + "torch/_tensor.py(1200): __bool__", 40, 100),
        _x("cpu_op", "aten::is_nonzero", t0 + 41, 98, pid), _x("cpu_op", "aten::item", t0 + 42, 96, pid),
        _x("cpu_op", "aten::_local_scalar_dense", t0 + 43, 94, pid),
        rt("cudaMemcpyAsync", 44, 16, 0), rt("cudaStreamSynchronize", 61, 29, 1),
        gpu("Memcpy DtoH (Device -> Pageable)", 50, 8, 0, cat="gpu_memcpy"),
        rt("cudaLaunchKernel", 150, 5, 2), gpu("gemm", 160, 150, 2),
        py(SP + "vllm/v1/worker/gpu_model_runner.py(2000): _to_list", 400, 100),
        rt("cudaStreamSynchronize", 410, 40, 3),
        py(SP + "vllm/v1/core/sched/scheduler.py(100): schedule", 600, 100),
        rt("cudaDeviceSynchronize", 610, 10, 4),
        py(SP + "sidecar_vllm/hooks.py(77): step_end", 800, 50),
        rt("cudaStreamSynchronize", 810, 10, 5),
        rt("cudaLaunchKernel", 860, 5, 6), gpu("sampler", 870, 100, 6),
    ]
    if with_event_sync:
        events += [py(SP + "vllm/model_executor/layers/sampler.py(12): forward", 720, 50),
                   rt("cudaEventSynchronize", 730, 20, 7)]
    return events


def engine_trace(path: Path) -> Path:
    """Two worker ranks: rank 0 records steps 0-1, rank 1 steps 0-2; the event sync happens once in
    each, in different steps."""
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"worker rank {r} (pid {pid})"}}
              for r, pid in ((0, 100), (1, 200))]
    events += _step(100, 0, 0, 1000, 10) + _step(100, 0, 1, 3000, 30, True)
    events += _step(200, 1, 0, 1100, 10, True) + _step(200, 1, 1, 3100, 30) + _step(200, 1, 2, 5100, 50)
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


# Per process, as the trace scan has named them since before engine profiles existed:
# (path, line, function, op, api, phase, classification, count, first_step, last_step)
RANK0_SITES = [
    ("/srv/models/mymodel.py", 88, "forward", "bool", "cudaStreamSynchronize", "forward", "hidden", 2, 0, 1),
    ("/srv/models/mymodel.py", 88, "forward", "bool", "cudaMemcpyAsync", "forward", "hidden", 2, 0, 1),
    ("vllm/model_executor/layers/sampler.py", 12, "forward", "event.synchronize", "cudaEventSynchronize", "forward", "hidden", 1, 1, 1),
    ("vllm/v1/core/sched/scheduler.py", 100, "schedule", "synchronize", "cudaDeviceSynchronize", "scheduling", "hidden", 2, 0, 1),
    # the sync inside the plugin's hook: its own frames are skipped, so the site is the caller's
    ("vllm/v1/worker/gpu_worker.py", 610, "execute_model", "stream.synchronize", "cudaStreamSynchronize", "other", "hidden", 2, 0, 1),
    ("vllm/v1/worker/gpu_model_runner.py", 2000, "_to_list", "stream.synchronize", "cudaStreamSynchronize", "sampling", "expected", 2, 0, 1),
]
FIELDS = ("path", "line", "function", "op", "api", "phase", "classification", "count", "first_step", "last_step")


def _rows(sites):
    return [tuple(s[k] for k in FIELDS) for s in sites]


@pytest.fixture
def vllm_profile():
    return pytest.importorskip("sidecar_vllm.profile", reason="the vLLM plugin package is not installed").VLLM_PROFILE


def test_the_engine_profile_gives_phases_expected_sites_and_skipped_frames(tmp_path, vllm_profile):
    report = scan_trace(engine_trace(tmp_path / "engine.json"), profile=vllm_profile)
    rank0, rank1 = report["processes"]
    assert (rank0["process"], rank0["steps"], rank1["steps"]) == ("worker rank 0 (pid 100)", 2, 3)
    assert _rows(rank0["sites"]) == RANK0_SITES
    expected = next(s for s in rank0["sites"] if s["function"] == "_to_list")
    assert "sampled token" in expected["reason"]
    # Without the profile: no phases, nothing expected, and the plugin's own frame is the site.
    generic = scan_trace(tmp_path / "engine.json", profile=engine.GENERIC)
    assert {s["phase"] for s in generic["sites"]} == {"other"}
    assert {s["classification"] for s in generic["sites"]} == {"hidden"}
    assert "sidecar_vllm/hooks.py" in {s["path"] for s in generic["sites"]}


def test_by_default_the_installed_engine_profiles_apply(tmp_path, vllm_profile, monkeypatch):
    path = engine_trace(tmp_path / "engine.json")
    monkeypatch.setattr(engine, "installed_profiles", lambda: [vllm_profile])
    assert scan_trace(path) == scan_trace(path, profile=vllm_profile)
    monkeypatch.setattr(engine, "installed_profiles", lambda: [])
    assert scan_trace(path) == scan_trace(path, profile=engine.GENERIC)


def test_sites_of_several_processes_merge_as_live_reports_do(tmp_path, vllm_profile):
    report = scan_trace(engine_trace(tmp_path / "engine.json"), profile=vllm_profile)
    merged = {(s["path"], s["api"]): s for s in report["sites"]}
    both = ["worker rank 0 (pid 100)", "worker rank 1 (pid 200)"]
    model = merged[("/srv/models/mymodel.py", "cudaStreamSynchronize")]
    # counts and times added, per-process rates added, the step range widened
    assert (model["count"], model["count_per_step"], model["first_step"], model["last_step"]) == (5, 2.0, 0, 2)
    # The GPU was idle before each of these syncs began (no kernel queued): they caused none of its idle time.
    assert model["processes"] == both and model["blocked_us"] == 145.0 and model["gpu_idle_after_us"] == 0.0
    event = merged[("vllm/model_executor/layers/sampler.py", "cudaEventSynchronize")]
    assert (event["count"], event["count_per_step"], event["first_step"], event["last_step"]) == (2, 0.833, 0, 1)
    assert merge_reports(report["processes"])["sites"] == report["sites"]


def test_a_site_outside_every_step_keeps_the_steps_it_was_seen_in():
    no_step = {"path": "a.py", "line": 1, "function": "f", "op": "item", "api": "cudaMemcpy", "count": 1,
               "count_per_step": 1.0, "blocked_us": 1.0, "gpu_idle_after_us": 0.0, "first_step": -1, "last_step": -1,
               "classification": "hidden", "reason": ""}
    in_step = {**no_step, "first_step": 3, "last_step": 4}
    merged = merge_sites([{"sites": [no_step]}, {"sites": [in_step]}], lambda r: None)
    assert [(s["first_step"], s["last_step"], s["count"]) for s in merged] == [(3, 4, 2)]
    other_api = {**in_step, "api": "cudaStreamSynchronize"}  # one line, two calls: two sites
    assert len(merge_sites([{"sites": [in_step, other_api]}], lambda r: None)) == 2


def test_trace_sites_skip_only_torch_and_this_project_unless_a_profile_adds_packages():
    stack = (SP + "vllm/v1/worker/gpu_worker.py(610): execute_model", SP + "sidecar_vllm/hooks.py(50): wrapper")
    assert trace_site(stack)["path"] == "sidecar_vllm/hooks.py"
    profile = engine.EngineProfile(name="e", skip_packages=("sidecar_vllm",))
    assert skip_prefixes(profile) == ("torch/", "sidecar/", "sidecar_vllm/")
    assert trace_site(stack, skip_prefixes(profile))["path"] == "vllm/v1/worker/gpu_worker.py"
