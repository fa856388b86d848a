"""The merge keeps, per process, what each probe noted of its step ranges (sidecar/common/phases.py
``whole_steps``): the merged trace lists the pids, as it writes them, of the processes whose ranges
are whole, and the capture's summary takes none of their steps for cut off (issue 28)."""

from __future__ import annotations

import gzip
import json

from sidecar.service.export.merge import SHARED_PID_BASE, finalize_capture

from test_merge import Rec, write_raw

# The last range ends with its step, the others where the next began: under half their median.
DURATIONS = (1000.0, 1000.0, 300.0)


def raw(pid: int, whole: bool) -> dict:
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}]
    for n, dur in enumerate(DURATIONS):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": pid, "tid": pid,
                       "ts": 100.0 + 1000.0 * n, "dur": dur})
    trace = {"schemaVersion": 1, "baseTimeNanoseconds": 5_000_000_000, "traceEvents": events}
    if whole:
        trace["inference_sidecar"] = {"whole_steps": True}  # where the probe's profiler writes it
    return trace


def merged(tmp_path, recs) -> tuple[dict, dict]:
    result = finalize_capture(tmp_path, recs, max_bytes=1 << 30)
    assert not result.problems, result.problems
    trace = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))
    summary = json.loads((tmp_path / "summary.json").read_text())
    return trace, {p["pid"]: [s["partial"] for s in p["steps"]] for p in summary["processes"]}


def test_the_merged_trace_lists_the_processes_whose_steps_are_whole(tmp_path):
    worker = write_raw(tmp_path, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"),
                       raw(101, True))
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"),
                     raw(100, False))
    trace, partial = merged(tmp_path, [worker, core])
    assert trace["inference_sidecar"]["whole_steps_pids"] == [101]
    assert "whole_steps" not in trace["inference_sidecar"]  # the merged trace's processes are not all whole
    assert partial == {101: [False, False, False], 100: [False, False, True]}
    # Each process's own compressed trace keeps its probe's member as it was.
    own = json.loads(gzip.decompress((tmp_path / "worker-rank0-pid101.pt.trace.json.gz").read_bytes()))
    assert own["inference_sidecar"] == {"whole_steps": True}


def test_a_process_with_a_track_pid_of_its_own_is_listed_under_it(tmp_path):
    # Two hosts' processes with one pid: the second gets a track pid of its own in the merged trace.
    a = write_raw(tmp_path, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"), raw(101, False))
    b = write_raw(tmp_path, Rec("worker", 101, 1, "worker rank 1 (pid 101)", "worker-rank1-pid101"), raw(101, True))
    trace, partial = merged(tmp_path, [a, b])
    pids = [p["pid"] for p in trace["inference_sidecar"]["processes"]]
    assert pids == [101, SHARED_PID_BASE + 1]
    assert trace["inference_sidecar"]["whole_steps_pids"] == [SHARED_PID_BASE + 1]
    assert partial == {101: [False, False, True], SHARED_PID_BASE + 1: [False, False, False]}


def test_no_process_says_it_no_key(tmp_path):
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"),
                     raw(100, False))
    trace, partial = merged(tmp_path, [core])
    assert "whole_steps_pids" not in trace["inference_sidecar"]
    assert partial == {100: [False, False, True]}
