"""Trace-based detection on the recorded GPU traces in ../shared/traces (real A100 / MI250 runs):
each synchronize call and blocking copy becomes a site in the live detector's report model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.syncs import AllowEntry, Allowlist
from sidecar.syncs.trace import scan_trace, trace_op, trace_site

TRACES = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def trace(name: str) -> Path:
    path = TRACES / name
    assert path.exists(), f"recorded trace {path} missing (the shared/ folder beside the repository)"
    return path


def by_api(report):
    return {(s["op"], s["api"]): s for s in report["sites"]}


def test_item_event_and_device_syncs_on_a100():
    report = scan_trace(trace("a100-cuda-event-sync.json.gz"))
    sites = by_api(report)
    # `if t:` on a CUDA tensor: a DtoH copy into pageable memory, then a stream sync, both under
    # aten::is_nonzero → item → _local_scalar_dense.
    assert set(sites) == {
        ("bool", "cudaMemcpyAsync"), ("bool", "cudaStreamSynchronize"),
        ("event.synchronize", "cudaEventSynchronize"), ("synchronize", "cudaDeviceSynchronize"),
    }
    copy = sites[("bool", "cudaMemcpyAsync")]
    assert (copy["kind"], copy["cpu_op"], copy["count"]) == ("pageable_copy", "aten::_local_scalar_dense", 1)
    assert copy["gpu_idle_after_us"] > 0 and copy["blocked_us"] > 0
    assert all(s["classification"] == "hidden" and s["phase"] == "other" for s in report["sites"])
    assert len(report["processes"]) == 1
    json.dumps(report)


def test_rocm_blocking_copies():
    sites = by_api(scan_trace(trace("mi250-rocm-toy.json.gz")))
    assert set(sites) == {("copy_to_host", "hipMemcpyWithStream"), ("synchronize", "hipDeviceSynchronize")}
    copy = sites[("copy_to_host", "hipMemcpyWithStream")]
    assert (copy["kind"], copy["count"], copy["cpu_op"]) == ("blocking_copy", 2, "aten::copy_")
    assert copy["gpu_idle_after_us"] > 0


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
    assert sites[("synchronize", "cudaDeviceSynchronize")]["classification"] == "hidden"


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
