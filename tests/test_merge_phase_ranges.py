"""The merge keeps what each probe noted of its phase ranges (sidecar/common/phases.py), so the capture's
summary has its step anatomy: the sidecar needs no engine plugin for it."""

from __future__ import annotations

import gzip
import json

from sidecar.service.export.merge import finalize_capture

from test_merge import Rec, kineto, write_raw


def noted(trace: dict, table: dict) -> dict:
    trace["inference_sidecar"] = {"phase_ranges": table}  # where the probe's profiler writes it
    trace["traceEvents"].append({"ph": "X", "cat": "user_annotation", "name": next(iter(table)),
                                 "pid": trace["traceEvents"][0]["pid"], "tid": trace["traceEvents"][0]["pid"],
                                 "ts": 102.0, "dur": 20.0})
    return trace


def test_each_process_s_phase_ranges_reach_the_merged_trace_and_its_summary(tmp_path):
    worker = write_raw(tmp_path, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"),
                       noted(kineto(101, 5_000_000_000), {"runner: forward": "forward"}))
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"),
                     noted(kineto(100, 5_000_000_000), {"core: schedule": "schedule"}))
    result = finalize_capture(tmp_path, [worker, core], max_bytes=1 << 30)
    assert not result.problems
    trace = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))
    assert trace["inference_sidecar"]["phase_ranges"] == {"runner: forward": "forward", "core: schedule": "schedule"}
    anatomy = json.loads((tmp_path / "summary.json").read_text())["anatomy"]
    phases = {p["process"]: p["mean_us"] for p in anatomy["processes"]}
    assert phases == {"worker rank 0 (pid 101)": {"forward": 20}, "engine core (pid 100)": {"schedule": 20}}
