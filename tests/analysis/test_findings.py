"""Syncs, gap causes, call sites and per-process attribution on traces built so that every
expected figure is known by construction."""

from __future__ import annotations

import copy
import gzip
import json
from types import SimpleNamespace

import pytest

from sidecar.analysis import analyze_path

from . import synth
from .conftest import trace_path

S = synth


def _scenario() -> list:
    """One step; kernels A..G on device 0 stream 7, one idle gap of each cause between them."""
    return [
        S.step(1, 0, 1000),
        # A 30-80, launched early inside aten::mm
        S.op("aten::mm", 10, 100), S.runtime("cudaLaunchKernel", 20, 5, 1), S.kernel("A", 30, 50, 1),
        # gap 80-120: the launch of B began at 70, before the GPU ran dry -> "launch"
        S.op("aten::add", 65, 50), S.runtime("cudaLaunchKernel", 70, 40, 2), S.kernel("B", 120, 30, 2),
        # gap 150-280: host busy in Python, C launched only at 265 -> "host"
        S.op("python_work", 155, 100, cat="user_annotation"),
        S.op("aten::relu", 260, 30), S.runtime("cudaLaunchKernel", 265, 5, 3), S.kernel("C", 280, 20, 3),
        # D 306-400 runs while .item() copies DtoH then blocks in cudaStreamSynchronize until 500
        S.runtime("cudaLaunchKernel", 303, 2, 5), S.kernel("D", 306, 94, 5),
        S.op("aten::item", 310, 200), S.op("aten::_local_scalar_dense", 312, 195),
        S.runtime("cudaMemcpyAsync", 315, 10, 4), S.kernel("Memcpy DtoH (Device -> Pinned)", 330, 5, 4, cat="gpu_memcpy"),
        S.runtime("cudaStreamSynchronize", 330, 170, 40),
        # gap 400-520: the sync had begun before the GPU went idle -> "sync"
        S.runtime("cudaLaunchKernel", 511, 3, 6), S.kernel("E", 520, 20, 6),
        # gap 540-605: an HtoD copy fills 55 of 65 us -> "memcpy"
        S.runtime("cudaMemcpyAsync", 541, 1, 7), S.kernel("Memcpy HtoD (Pinned -> Device)", 545, 55, 7, cat="gpu_memcpy"),
        S.runtime("cudaLaunchKernel", 542, 1, 8), S.kernel("F", 605, 15, 8),
        # a blocking cudaMemcpy inside aten::copy_, a device sync at top level
        S.op("aten::copy_", 690, 70), S.runtime("cudaMemcpy", 700, 50, 9),
        S.kernel("Memcpy DtoH (Device -> Pageable)", 710, 5, 9, cat="gpu_memcpy"),
        S.runtime("cudaDeviceSynchronize", 800, 10, 41),
        # a later runtime call: the device sync is not the thread's last (which would be
        # torch.profiler's own at stop, left out of the findings)
        S.runtime("cudaGetDevice", 880, 1, 98),
        # gap 620-900: G has no launch record -> "unknown"
        S.kernel("G", 900, 10, 99),
    ]


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    path = S.write(tmp_path_factory.mktemp("scenario") / "trace.json", _scenario())
    return analyze_path(path)


def test_gap_causes(scenario):
    gaps = scenario["gaps"]
    assert gaps["count"] == 5
    assert {cause: v["count"] for cause, v in gaps["by_cause"].items()} == {"sync": 1, "memcpy": 1, "launch": 1, "host": 1, "unknown": 1}
    by_cause = {g["cause"]: g for g in gaps["largest"]}
    assert by_cause["launch"]["dur_us"] == 40 and by_cause["launch"]["preceded_by"] == "A" and by_cause["launch"]["followed_by"] == "B"
    assert by_cause["launch"]["detail"] == "cudaLaunchKernel in aten::add"
    assert by_cause["host"]["dur_us"] == 130 and by_cause["host"]["detail"] == "host busy until aten::relu launched the next kernel"
    assert by_cause["sync"]["dur_us"] == 120 and by_cause["sync"]["detail"] == "cudaStreamSynchronize in aten::_local_scalar_dense"
    assert by_cause["memcpy"]["dur_us"] == 65
    assert by_cause["unknown"]["dur_us"] == 280
    assert [g["dur_us"] for g in gaps["largest"]] == [280, 130, 120, 65, 40]


def test_syncs_with_sites_and_idle_after(scenario):
    syncs = {s["name"]: s for s in scenario["syncs"]}
    assert set(syncs) == {"cudaStreamSynchronize", "cudaMemcpy", "cudaDeviceSynchronize"}
    stream = syncs["cudaStreamSynchronize"]
    assert (stream["kind"], stream["count"], stream["total_us"]) == ("sync", 1, 170)
    assert stream["after_dtoh_copy"] == 1
    assert stream["gpu_idle_after_us"] == 120  # GPU idle from 400 (after the call began) to E at 520
    site = stream["sites"][0]
    assert site["site"] == "aten::_local_scalar_dense"
    assert site["stack"] == ["aten::item", "aten::_local_scalar_dense"]
    assert site["steps"] == [1]
    copy_ = syncs["cudaMemcpy"]
    assert copy_["kind"] == "blocking_copy" and copy_["sites"][0]["site"] == "aten::copy_"
    # Both were called inside the gap 620-900 that G, with no launch record, ends ("unknown"): the GPU was
    # idle before them, so neither caused any of it (the same attribution as the gap causes).
    assert copy_["gpu_idle_after_us"] == 0
    device = syncs["cudaDeviceSynchronize"]
    assert device["sites"][0]["site"] == "" and device["gpu_idle_after_us"] == 0
    assert sum(s["gpu_idle_after_us"] for s in scenario["syncs"]) == scenario["gaps"]["by_cause"]["sync"]["total_us"]


def test_step_figures(scenario):
    (step,) = scenario["steps"]
    assert step["step"] == 1 and step["wall_us"] == 1000
    assert step["kernel_count"] == 7 and step["kernel_time_us"] == 50 + 30 + 20 + 94 + 20 + 15 + 10
    assert step["launch_count"] == 6
    assert step["sync_count"] == 3 and step["sync_us"] == 170 + 50 + 10
    assert step["memcpy_count"] == 3 and step["memcpy_us"] == 65
    assert step["gap_count"] == 5


def test_cpu_self_time(scenario):
    ops = {op["name"]: op for op in scenario["cpu"]["top_ops"]}
    assert ops["aten::item"]["self_us"] == 5  # 200 minus its child's 195
    assert ops["aten::_local_scalar_dense"]["self_us"] == 195 - 10 - 170
    assert ops["aten::add"]["self_us"] == 50 - 40


def test_memcpy_directions(scenario):
    copies = scenario["gpu"]["memcpy"]
    assert {k: v["count"] for k, v in copies.items()} == {"DtoH": 2, "HtoD": 1}


def test_collective_overlap(tmp_path):
    events = [
        S.runtime("cudaLaunchKernel", 0, 1, 1), S.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10, 100, 1, stream=20),
        S.runtime("cudaLaunchKernel", 1, 1, 2), S.kernel("gemm", 50, 100, 2, stream=7),
    ]
    summary = analyze_path(S.write(tmp_path / "t.json", events))
    comm = summary["collectives"]
    assert comm["count"] == 1 and comm["time_us"] == 100
    assert comm["overlapped_us"] == 60 and comm["overlap_fraction"] == 0.6 and comm["exposed_us"] == 40
    assert summary["gpu"]["busy_us"] == 140  # union of 10-110 and 50-150


def test_merged_trace_splits_processes(tmp_path):
    """The sidecar's merged trace (sidecar.service.export.merge.write_merged) of two workers whose
    correlation ids are all the same: each worker gets exactly its own kernels and steps."""
    from sidecar.service.export.merge import check_trace, write_merged

    with gzip.open(trace_path("a100-cuda-event-sync.json.gz"), "rt") as fh:
        rank0 = json.load(fh)
    rank0["baseTimeNanoseconds"] = 10**15
    rank1 = copy.deepcopy(rank0)
    rank1["baseTimeNanoseconds"] += 2_000  # 2 us later: lockstep, as tensor-parallel workers run
    for ev in rank1["traceEvents"]:
        if ev.get("pid") == 948300:
            ev["pid"] = 4321
    records = [
        SimpleNamespace(label="worker rank 0 (pid 948300)", role="worker", pid=948300, rank=0, step_driven=True),
        SimpleNamespace(label="worker rank 1 (pid 4321)", role="worker", pid=4321, rank=1, step_driven=True),
    ]
    raw = []
    for rec, data in zip(records, [rank0, rank1]):  # plain JSON files, as the probes write them
        path = tmp_path / f"rank{rec.rank}.json"
        path.write_text(json.dumps(data))
        raw.append(check_trace(rec, path))
    merged = tmp_path / "trace.json.gz"
    write_merged(merged, raw)
    summary = analyze_path(merged)
    workers = {p["label"]: p for p in summary["processes"] if p["gpu"]["kernel_count"]}
    assert set(workers) == {"worker rank 0 (pid 948300)", "worker rank 1 (pid 4321)"}
    for label, process in workers.items():
        assert process["gpu"]["kernel_count"] == 4
        assert process["rank"] == int(label.split("rank ")[1][0])
        assert [s["step"] for s in process["steps"]] == [100]
        # 3, and the profiler's own synchronize at stop reported apart
        assert sum(s["count"] for s in process["syncs"]) == 3 and process["profiler_stop_sync_us"] > 0
    assert sorted((s["process"], s["step"]) for s in summary["steps"]) == [
        ("worker rank 0 (pid 948300)", 100),
        ("worker rank 1 (pid 4321)", 100),
    ]
    assert summary["gpu"]["kernel_count"] == 8


def test_rank_files_in_a_folder(tmp_path):
    for rank in (0, 1):
        events = [S.step(5, 0, 100, pid=10 + rank, tid=10 + rank), S.runtime("cudaLaunchKernel", 5, 2, 1, pid=10 + rank, tid=10 + rank), S.kernel("k", 10, 20 + rank, 1, device=rank)]
        S.write(tmp_path / f"rank{rank}.json.gz", events, distributedInfo={"rank": rank, "world_size": 2})
    summary = analyze_path(tmp_path)
    assert [(p["rank"], p["gpu"]["kernel_time_us"]) for p in summary["processes"]] == [(0, 20), (1, 21)]
    assert [p["label"] for p in summary["processes"]] == ["rank 0: pid 10", "rank 1: pid 11"]
    assert len(summary["source"]["files"]) == 2 and len(summary["steps"]) == 2


def test_gpu_only_trace(tmp_path):
    events = [S.kernel("k", 0, 10, 1), S.kernel("k", 20, 10, 2, device=1, pid=1)]
    summary = analyze_path(S.write(tmp_path / "gpu.json", events))
    assert summary["gpu"]["kernel_count"] == 2
    assert len(summary["processes"]) == 2
    assert all("no host events" in p["label"] for p in summary["processes"])
