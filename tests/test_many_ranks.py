"""One capture across 16 ranks, over the real probe channel (the many-ranks benchmark's simulated
ranks, benchmarks/simulated_ranks.py, with small traces): it ends ``done``, and every rank is in the
merged trace, named, with its GPU track, and in the summary. A correctness check of the many-ranks
benchmark's path; its figures are docs/benchmarks.md's, not asserted here."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from sidecar.analysis import analyze_path
from sidecar.service.app import ServiceSettings, make_app

REPO = Path(__file__).resolve().parents[1]
TOKEN = "many-ranks-probe-token"
RANKS = 16


def _simulated_ranks():
    spec = importlib.util.spec_from_file_location("simulated_ranks", REPO / "benchmarks" / "simulated_ranks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def small_gpu_trace(path: Path, steps: int = 3, kernels_per_step: int = 20) -> None:
    """A small Kineto GPU trace of one rank: ProfilerStep ranges, ops launching kernels on device 0
    (correlation ids and flow arrows, as Kineto writes them), its process name, its base time."""
    pid, tid = 4242, 4243
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
                          {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}}]
    ts, corr = 10.0, 1
    for step in range(steps):
        start = ts
        for _ in range(kernels_per_step):
            events += [
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid, "ts": ts, "dur": 8.0},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid, "ts": ts + 1,
                 "dur": 5.0, "args": {"correlation": corr}},
                {"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": ts + 1, "cat": "ac2g", "name": "ac2g"},
                {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": ts + 9, "dur": 20.0,
                 "args": {"device": 0, "stream": 7, "correlation": corr}},
                {"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": ts + 9, "cat": "ac2g", "name": "ac2g", "bp": "e"},
            ]
            ts += 25.0
            corr += 1
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": tid,
                       "ts": start, "dur": ts - start})
        ts += 5.0
    trace = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
             "traceEvents": events, "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    path.write_text(json.dumps(trace, indent=1))


async def test_a_capture_across_sixteen_ranks_merges_every_rank(aiohttp_server, tmp_path):
    bench = _simulated_ranks()
    settings = ServiceSettings(trace_dir=tmp_path / "traces", probe_token=TOKEN, http_token=None, max_steps=50,
                               max_capture_bytes=1 << 30, keep=5, stop_grace_s=2.0)
    server = await aiohttp_server(make_app(settings))
    source = tmp_path / "rank.json"
    small_gpu_trace(source)
    template = bench.TraceTemplate.load(source)
    assert template.host_pid == 4242
    staged = bench.stage_traces(template, RANKS, tmp_path / "staged")

    run = await bench.run_capture(str(server.make_url("")).rstrip("/"), tmp_path / "probe-root", staged, TOKEN,
                                  steps=2, step_rate=50.0, timeout_s=60.0)

    capture = run.capture
    assert capture["state"] == "done", capture
    assert [p["state"] for p in capture["processes"]] == ["done"] * RANKS
    pids = [bench.PID_BASE + rank for rank in range(RANKS)]
    labels = [f"worker rank {rank} (pid {pid})" for rank, pid in enumerate(pids)]
    assert [p["label"] for p in run.merged_processes] == labels
    merged = settings.trace_dir / "captures" / capture["id"] / "trace.json.gz"
    names = bench.merged_process_names(merged)
    assert [names.get(pid) for pid in pids] == labels
    for label in labels:  # each rank's GPU track is its own, named after it
        assert f"{label} device 0" in names.values()
    assert sorted({p["rank"] for p in run.summary["processes"]}) == list(range(RANKS))
    # The sidecar analyses the merged trace one process at a time (merge.analyse_by_process): the same
    # summary as the whole file's, where every rank repeats the others' correlation ids.
    assert run.summary == json.loads(json.dumps(analyze_path(merged)))
    # Every rank's raw file was taken by the merge and removed.
    assert not list((tmp_path / "probe-root" / "captures").rglob("*.json"))
