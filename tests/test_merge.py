"""Merging per-process Kineto traces into one timeline, with the sampled Python stacks a probe left
beside its trace (its raw samples file), which become slices in that process's events."""

import gzip
import importlib.util
import json
import os
import sys
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sidecar.stacks import sampled as sampled_stacks
from sidecar.service.export.kineto_file import copy_with_events
from sidecar.service.export.merge import DEVICE_PID_BASE, finalize_capture
from sidecar.stacks.samples_file import RawSamples, Segment, check, encode, samples_path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"


@dataclass
class Rec:
    """A capture's process record, as far as the merge reads it."""

    role: str
    pid: int
    rank: int | None
    label: str
    stem: str
    state: str = "done"
    raw_file: str | None = None
    step_driven: bool = True
    stacks: str = "none"
    stacks_file: str | None = None  # the probe's raw samples beside raw_file (sampled stacks)
    stack_summary: dict[str, Any] | None = None

    @property
    def sort_key(self) -> tuple:  # as sidecar.common.protocol.ProcessIdentity.sort_key
        return (self.step_driven, self.rank is not None, self.rank or 0, self.role, self.pid)


def kineto(pid, base_ns, device_pid=None, flow_id=7):
    events = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": pid, "tid": pid, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": 110.0, "dur": 10.0},
        {"ph": "s", "id": flow_id, "pid": pid, "tid": pid, "ts": 111.0, "cat": "ac2g", "name": "ac2g"},
    ]
    if device_pid is not None:
        events.append({"ph": "X", "cat": "kernel", "name": "gemm", "pid": device_pid, "tid": 7, "ts": 120.0, "dur": 5.0})
        events.append({"ph": "f", "id": flow_id, "pid": device_pid, "tid": 7, "ts": 120.0, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    return {"schemaVersion": 1, "baseTimeNanoseconds": base_ns, "traceEvents": events}


def write_raw(capture_dir: Path, rec: Rec, trace: dict) -> Rec:
    raw = capture_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    path = raw / f"{rec.stem}.json"
    path.write_text(json.dumps(trace))
    rec.raw_file = str(path)
    return rec


def test_merge_aligns_clocks_and_separates_devices(tmp_path):
    w0 = write_raw(tmp_path, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"), kineto(101, 5_000_000_000, device_pid=0))
    w1 = write_raw(tmp_path, Rec("worker", 102, 1, "worker rank 1 (pid 102)", "worker-rank1-pid102"), kineto(102, 5_000_002_000, device_pid=0))
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, 4_999_999_000))
    result = finalize_capture(tmp_path, [w0, w1, core], max_bytes=1 << 30)

    assert result.trace_file == "trace.json.gz" and not result.problems
    assert {stem: o.file for stem, o in result.processes.items()} == {
        "worker-rank0-pid101": "worker-rank0-pid101.pt.trace.json.gz",
        "worker-rank1-pid102": "worker-rank1-pid102.pt.trace.json.gz",
        "engine_core-pid100": "engine_core-pid100.pt.trace.json.gz",
    }
    assert not (tmp_path / "raw").exists()
    per_process = json.load(gzip.open(tmp_path / "worker-rank1-pid102.pt.trace.json.gz"))
    assert per_process["baseTimeNanoseconds"] == 5_000_002_000  # per-process files are the originals

    merged = json.load(gzip.open(tmp_path / "trace.json.gz"))
    assert merged["baseTimeNanoseconds"] == 4_999_999_000
    ev = merged["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("ph") == "M" and e["name"] == "process_name"}
    assert names[100] == "engine core (pid 100)" and names[101] == "worker rank 0 (pid 101)"
    assert "python" not in names.values()
    steps = {e["pid"]: e["ts"] for e in ev if e.get("name") == "ProfilerStep#0"}
    # Same local ts 100 us, bases 1 us apart (core) and 3 us apart (rank 1) from the earliest base.
    assert steps == {100: 100.0, 101: 101.0, 102: 103.0}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert len({k["pid"] for k in kernels}) == 2, "each rank's device 0 gets its own track"
    assert all(k["pid"] >= DEVICE_PID_BASE for k in kernels)
    assert {names[k["pid"]] for k in kernels} == {"worker rank 0 (pid 101) device 0", "worker rank 1 (pid 102) device 0"}
    flow_ids = [e["id"] for e in ev if e.get("ph") == "s"]
    assert len(set(flow_ids)) == 3, "flow ids stay unique across processes"
    finishes = {e["pid"]: e["id"] for e in ev if e.get("ph") == "f"}
    starts = {e["pid"]: e["id"] for e in ev if e.get("ph") == "s"}
    assert sorted(finishes.values()) == sorted(starts[p] for p in (101, 102))


def test_processes_of_two_hosts_with_one_pid_keep_a_track_each(tmp_path):
    """Two workers in two containers, both pid 7: each keeps its own track and name, and the
    summary one entry each."""
    a = write_raw(tmp_path, Rec("worker", 7, 0, "worker rank 0 (pid 7)", "worker-rank0-pid7"), kineto(7, 5_000_000_000, device_pid=0))
    b = write_raw(tmp_path, Rec("worker", 7, 1, "worker rank 1 (pid 7)", "worker-rank1-pid7"), kineto(7, 5_000_001_000, device_pid=0))
    result = finalize_capture(tmp_path, [a, b], max_bytes=1 << 30)
    assert result.trace_file and not result.problems
    merged = json.load(gzip.open(tmp_path / "trace.json.gz"))
    names = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e.get("ph") == "M" and e["name"] == "process_name"}
    hosts = {pid: name for pid, name in names.items() if "device" not in name}
    assert sorted(hosts.values()) == ["worker rank 0 (pid 7)", "worker rank 1 (pid 7)"] and len(hosts) == 2
    steps = [e["pid"] for e in merged["traceEvents"] if e.get("name") == "ProfilerStep#0"]
    assert sorted(steps) == sorted(hosts), "each process's step on its own track"
    assert [p["pid"] for p in merged["inference_sidecar"]["processes"]] == sorted(hosts)
    summary = json.load(open(tmp_path / "summary.json"))
    assert sorted(p["label"] for p in summary["processes"] if p["label"].startswith("worker")) == sorted(hosts.values())


def test_size_limit_drops_files_and_says_so(tmp_path):
    w0 = write_raw(tmp_path, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"), kineto(101, 1))
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, 1))
    limit = Path(w0.raw_file).stat().st_size + 10
    result = finalize_capture(tmp_path, [core, w0], max_bytes=limit)
    assert result.processes["worker-rank0-pid101"].file == "worker-rank0-pid101.pt.trace.json.gz"  # workers are kept first
    assert "size limit" in result.processes["engine_core-pid100"].error
    assert any("size limit" in p for p in result.problems)
    assert result.trace_file is not None


def test_files_outside_the_capture_or_corrupt_are_refused(tmp_path):
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(kineto(1, 1)))
    evil = Rec("worker", 1, 0, "w", "worker-rank0-pid1", raw_file=str(outside))
    (tmp_path / "cap" / "raw").mkdir(parents=True)
    broken = Rec("engine_core", 2, None, "e", "engine_core-pid2", raw_file=str(tmp_path / "cap" / "raw" / "e.json"))
    Path(broken.raw_file).write_text('{"traceEvents": [')
    result = finalize_capture(tmp_path / "cap", [evil, broken], max_bytes=1 << 30)
    assert "outside" in result.processes["worker-rank0-pid1"].error
    assert "unreadable" in result.processes["engine_core-pid2"].error
    assert result.trace_file is None and outside.exists()


def test_raw_files_under_a_probes_own_trace_root_are_taken_and_their_folders_removed(tmp_path):
    capture_id = "20260101-000000-abcdef"
    capture_dir = tmp_path / "traces" / "captures" / capture_id
    capture_dir.mkdir(parents=True)
    probe_root = tmp_path / "probe-root"
    w0 = write_raw(probe_root / "captures" / capture_id, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"),
                   kineto(101, 1))
    # Another capture's raw file: never this capture's to read or delete.
    stray = write_raw(probe_root / "captures" / "20260101-000000-999999",
                      Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, 1))
    result = finalize_capture(capture_dir, [w0, stray], max_bytes=1 << 30)
    assert result.trace_file == "trace.json.gz"
    assert result.processes["worker-rank0-pid101"].file == "worker-rank0-pid101.pt.trace.json.gz"
    assert "outside" in result.processes["engine_core-pid100"].error and Path(stray.raw_file).is_file()
    assert not Path(w0.raw_file).exists() and not (probe_root / "captures" / capture_id).exists()
    assert (probe_root / "captures").is_dir()


def _bench_merge():
    """benchmarks/bench_merge.py, which keeps the merge as it was before it streamed (json.load)."""
    if "bench_merge" not in sys.modules:
        spec = importlib.util.spec_from_file_location("bench_merge", REPO / "benchmarks" / "bench_merge.py")
        module = sys.modules["bench_merge"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["bench_merge"]


def _raw_copy(capture_dir: Path, rec: Rec, name: str, base_ns: int | None) -> Rec:
    """A recorded trace as a probe writes it: plain JSON in raw/, with ``baseTimeNanoseconds`` after
    ``traceEvents`` where Kineto puts it."""
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"recorded trace {path} not found (the shared/ folder beside the repository)")
    text = gzip.decompress(path.read_bytes()).rstrip()
    if base_ns is not None:
        assert text.endswith(b"}")
        text = text[:-1] + b', "baseTimeNanoseconds": %d}' % base_ns
    raw = capture_dir / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / f"{rec.stem}.json").write_bytes(text)
    rec.raw_file = str(raw / f"{rec.stem}.json")
    return rec


def test_streaming_merge_gives_the_same_trace_as_loading_each_file_whole(tmp_path):
    """Real traces (GPU tracks, flows, string track pids, ROCm) as four processes of one capture with
    different clocks: byte for byte the merged trace the json.load merge wrote."""
    bench = _bench_merge()

    def capture(root: Path) -> list[Rec]:
        """The four processes, listed out of order (the merge orders them)."""
        return [
            _raw_copy(root, Rec("worker", 102, 1, "worker rank 1 (pid 102)", "worker-rank1-pid102"),
                      "mi250-rocm-toy.json.gz", 5_000_002_500),
            _raw_copy(root, Rec("api_server", 99, None, "API server (pid 99)", "api_server-pid99", step_driven=False),
                      "a100-cuda-event-sync.json.gz", None),
            _raw_copy(root, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"),
                      "a100-nccl-multistream.json.gz", 5_000_000_000),
            _raw_copy(root, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"),
                      "cpu-only-tiny.json.gz", 4_999_999_000),
        ]

    ours, theirs = tmp_path / "streaming", tmp_path / "json.load"
    new = finalize_capture(ours, capture(ours), max_bytes=1 << 30)
    old = bench.reference_finalize(theirs, capture(theirs), 1 << 30, analyse=False)
    assert new.trace_file == old.trace_file == "trace.json.gz" and not new.problems
    assert {k: v.file for k, v in new.processes.items()} == {k: v.file for k, v in old.processes.items()}
    merged = gzip.decompress((ours / "trace.json.gz").read_bytes())
    assert merged == gzip.decompress((theirs / "trace.json.gz").read_bytes())
    trace = json.loads(merged)
    assert [p["pid"] for p in trace["inference_sidecar"]["processes"]] == [99, 100, 101, 102]
    assert trace["baseTimeNanoseconds"] == 0  # the API server's trace has no base: 0, as before
    assert new.summary_file == "summary.json" and not (ours / "raw").exists()


def test_a_trace_that_is_an_event_list_or_has_no_events_is_refused(tmp_path):
    cap = tmp_path / "cap"
    (cap / "raw").mkdir(parents=True)
    listed = Rec("worker", 1, 0, "w", "worker-rank0-pid1", raw_file=str(cap / "raw" / "w.json"))
    Path(listed.raw_file).write_text(json.dumps(kineto(1, 1)["traceEvents"]))
    empty = Rec("engine_core", 2, None, "e", "engine_core-pid2", raw_file=str(cap / "raw" / "e.json"))
    Path(empty.raw_file).write_text('{"schemaVersion": 1}')
    result = finalize_capture(cap, [listed, empty], max_bytes=1 << 30)
    assert "not a Kineto trace" in result.processes["worker-rank0-pid1"].error
    assert "traceEvents" in result.processes["engine_core-pid2"].error
    assert result.trace_file is None and not (cap / "raw").exists()


def test_bench_merge_runs(tmp_path):
    """benchmarks/bench_merge.py on a small trace: both merges run and agree (figures not asserted)."""
    path = TRACES / "a100-cuda-event-sync.json.gz"
    if not path.is_file():
        pytest.skip(f"recorded trace {path} not found")
    out = tmp_path / "merge.json"
    assert _bench_merge().main(["--trace", str(path), "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["identical"] and set(result["results"]["merge"]) == {"json.load", "streaming"}


# -- sampled Python stacks ------------------------------------------------------------------------------
MS = 1_000_000


def samples_for(pid: int, wall_ns: int, stop_reason: str | None = None) -> RawSamples:
    """Three samples 1 ms apart from Unix time ``wall_ns``: ``schedule`` inside ``step``, then ``step``."""
    frames = [("[stack cut at 128 frames]", "", 0), ("step", "/app/core.py", 10), ("schedule", "/app/sched.py", 40)]
    return RawSamples(
        pid=pid, thread_id=1, native_id=pid, hz=1000.0, period_ns=MS, switch_interval_s=0.005, frames=frames,
        cut_frame=0, stack_frames=array("i", [2, 1, 1]).tobytes(), stack_ends=array("i", [2, 3]).tobytes(),
        times=array("q", [0, MS, 2 * MS]).tobytes(), stack_ids=array("i", [0, 0, 1]).tobytes(),
        lines=array("i", [41, 42, 12]).tobytes(), waits=array("q", [0, 0, 0]).tobytes(),
        segments=[Segment(0, 3, 0, 3 * MS, (0, wall_ns), (3 * MS, wall_ns + 3 * MS))],
        stop_reason=stop_reason, active_ns=3 * MS, events=3, estimated_bytes=600)


def write_samples(rec: Rec, data: bytes | RawSamples) -> Rec:
    """A probe's samples file beside its raw trace."""
    path = Path(samples_path(rec.raw_file))
    path.write_bytes(encode(data) if isinstance(data, RawSamples) else data)
    rec.stacks, rec.stacks_file = "sampled", str(path)
    return rec


def sampled(events: list[dict], pid: int) -> list[dict]:
    return [e for e in events if e.get("pid") == pid and e.get("tid") == sampled_stacks.TRACK_TID_BASE + pid]


def test_sampled_stacks_become_slices_of_their_process_on_its_clock(tmp_path):
    base_core, base_worker = 4_999_999_000, 5_000_002_000
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, base_core))
    w0 = write_raw(tmp_path, Rec("worker", 101, 0, "worker rank 0 (pid 101)", "worker-rank0-pid101"), kineto(101, base_worker))
    raw = samples_for(100, base_core + 105_000, stop_reason="max_events reached")  # 105 us after the core's base
    write_samples(core, raw)
    result = finalize_capture(tmp_path, [core, w0], max_bytes=1 << 30)
    assert result.trace_file and not result.problems
    expected = sampled_stacks.events(check(raw), base_core)
    assert [e["name"] for e in expected if e["ph"] == "X"] == ["step (core.py:10)", "schedule (sched.py:40)"]

    # The process's own file: the slices first in its traceEvents, as the probe used to put them.
    own = json.load(gzip.open(tmp_path / result.processes["engine_core-pid100"].file))
    assert own["traceEvents"][:len(expected)] == expected
    assert own["traceEvents"][len(expected):] == kineto(100, base_core)["traceEvents"]
    # The merged trace: the same slices, shifted with the rest of the process (its base is the earliest).
    merged = json.load(gzip.open(tmp_path / result.trace_file))["traceEvents"]
    mine = sampled(merged, 100)
    assert [(e["name"], e["ts"]) for e in mine] == [(e["name"], e["ts"]) for e in expected]
    step = next(e for e in mine if e["name"].startswith("step ("))
    assert step["ts"] == 105.0 and step["args"] == {"file": "/app/core.py", "line": 10, "samples": 3, "depth": 0}
    assert [e["name"] for e in mine if e["ph"] == "i"] == ["stack sampler stopped: max_events reached"]
    assert not sampled(merged, 101)

    # The summary is the sidecar's now: in the outcome, the analysis' python_stacks and headline.
    summary = result.processes["engine_core-pid100"].stack_summary
    assert summary == sampled_stacks.summary(check(raw))
    assert summary["top_self"][0]["function"] == "schedule" and summary["stop_reason"] == "max_events reached"
    assert result.processes["worker-rank0-pid101"].stack_summary is None
    analysed = json.loads((tmp_path / result.summary_file).read_text())
    assert analysed["python_stacks"]["engine core (pid 100)"]["top_self"][0]["function"] == "schedule"
    assert "python: engine core (pid 100)" in result.headline
    assert not (tmp_path / "raw").exists(), "the samples file goes with the raw folder"


@pytest.mark.parametrize("damage, why", [
    (b"\x00garbage", "unreadable"),
    (encode(samples_for(100, 5_000_000_000))[:-5], "unreadable"),
    (None, "missing"),
])
def test_a_corrupt_or_missing_samples_file_loses_the_stacks_not_the_trace(tmp_path, damage, why):
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, 5_000_000_000))
    write_samples(core, damage or b"")
    if damage is None:
        os.unlink(core.stacks_file)
    result = finalize_capture(tmp_path, [core], max_bytes=1 << 30)
    outcome = result.processes["engine_core-pid100"]
    assert outcome.error is None and outcome.file and result.trace_file and not result.problems
    assert outcome.stack_summary["samples"] == 0
    assert outcome.stack_summary["error"].startswith("python stacks lost: samples file " + why)
    merged = json.load(gzip.open(tmp_path / result.trace_file))["traceEvents"]
    assert not sampled(merged, 100) and any(e.get("name") == "ProfilerStep#0" for e in merged)
    analysed = json.loads((tmp_path / result.summary_file).read_text())
    assert why in analysed["python_stacks"]["engine core (pid 100)"]["error"]
    assert not (tmp_path / "raw").exists()


def test_stacks_that_cannot_go_into_the_trace_leave_it_without_them(tmp_path, monkeypatch):
    def broken(*_args, **_kwargs):
        yield {"ph": "M", "name": "thread_name"}
        raise RuntimeError("a bug")

    monkeypatch.setattr(sampled_stacks, "iter_events", broken)
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, 1))
    write_samples(core, samples_for(100, 1))
    result = finalize_capture(tmp_path, [core], max_bytes=1 << 30)
    outcome = result.processes["engine_core-pid100"]
    assert outcome.error is None and result.trace_file
    assert json.load(gzip.open(tmp_path / outcome.file)) == kineto(100, 1)
    assert outcome.stack_summary["samples"] == 3, "the summary is still the samples'"
    assert outcome.stack_summary["error"] == "python stacks not added to the trace: a bug"
    merged = json.load(gzip.open(tmp_path / result.trace_file))["traceEvents"]
    assert not [e for e in merged if e.get("name") == "thread_name"]


def test_a_samples_file_outside_the_capture_is_neither_read_nor_deleted(tmp_path):
    cap = tmp_path / "cap"
    core = write_raw(cap, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, 1))
    outside = tmp_path / "elsewhere.stacks.msgpack"
    outside.write_bytes(encode(samples_for(100, 1)))
    core.stacks, core.stacks_file = "sampled", str(outside)
    result = finalize_capture(cap, [core], max_bytes=1 << 30)
    assert "outside" in result.processes["engine_core-pid100"].stack_summary["error"]
    assert result.trace_file and outside.exists()


def test_the_slices_count_against_the_capture_size_limit(tmp_path):
    core = write_raw(tmp_path, Rec("engine_core", 100, None, "engine core (pid 100)", "engine_core-pid100"), kineto(100, 1))
    write_samples(core, samples_for(100, 1))
    limit = Path(core.raw_file).stat().st_size + 100  # the trace fits; with its 600 estimated bytes of slices it does not
    result = finalize_capture(tmp_path, [core], max_bytes=limit)
    assert "size limit" in result.processes["engine_core-pid100"].error
    assert not (tmp_path / "raw").exists()


def test_sampled_stacks_in_a_real_export_are_read_by_the_analyser_and_the_merge(tmp_path):
    """A real torch.profiler export and a real sampler: the process's file, as the sidecar writes it,
    is a trace the analyser reads with the slices as Python frames nested as sampled."""
    torch = pytest.importorskip("torch")
    import torch.profiler as tp

    from sidecar.analysis import analyze_path
    from sidecar.analysis.reader.events import Kind
    from sidecar.analysis.reader.nesting import build_tree
    from sidecar.analysis.summary import load
    from sidecar.stacks.sampler import StackSampler

    def planted_slow(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    x = torch.ones(32, 32)
    sampler = StackSampler(threading.get_ident())
    try:
        prof = tp.profile(activities=[tp.ProfilerActivity.CPU], schedule=lambda _s: tp.ProfilerAction.RECORD)
        prof.start()
        sampler.start()
        for _ in range(3):
            torch.mm(x, x)
            planted_slow(0.02)
            time.sleep(0.01)
            prof.step()
        sampler.stop()
        prof.stop()
        pid = os.getpid()
        rec = Rec("engine_core", pid, None, f"engine core (pid {pid})", f"engine_core-pid{pid}")
        raw = tmp_path / "raw"
        raw.mkdir()
        rec.raw_file = str(raw / f"{rec.stem}.json")
        prof.export_chrome_trace(rec.raw_file)
        sampler.dump(samples_path(rec.raw_file))
        rec.stacks, rec.stacks_file = "sampled", samples_path(rec.raw_file)
    finally:
        sampler.close()
    before = json.load(open(rec.raw_file))
    result = finalize_capture(tmp_path, [rec], max_bytes=1 << 30)
    own = tmp_path / result.processes[rec.stem].file
    after = json.load(gzip.open(own))
    tid = sampled_stacks.TRACK_TID_BASE + threading.get_native_id()
    mine = [e for e in after["traceEvents"] if e.get("tid") == tid]
    added = len(after["traceEvents"]) - len(before["traceEvents"])
    assert added == len(mine) > 5
    assert {k: v for k, v in after.items() if k != "traceEvents"} == {k: v for k, v in before.items() if k != "traceEvents"}

    summary = analyze_path(own)
    assert not [w for w in summary["warnings"] if "skipped" in w or "ignored" in w], summary["warnings"]
    assert summary["source"]["files"][0]["events"] == len(after["traceEvents"])
    assert summary["steps"], "ProfilerStep ranges still found"
    data = load(own)
    track = data.threads[(pid, tid)]
    assert len(track.ts) == len([e for e in mine if e["ph"] == "X"])
    assert (track.kind == Kind.PYTHON).all()
    # The analyser's own nesting puts every slice under the slice one level up.
    depth = {i: e["args"]["depth"] for i, e in enumerate(e for e in mine if e["ph"] == "X")}
    parent = build_tree(track).parent
    for i, p in enumerate(parent.tolist()):
        assert (p == -1) == (depth[i] == 0) and (p == -1 or depth[p] == depth[i] - 1)
    names = {data.names[n] for n in track.name.tolist()}
    assert any("planted_slow (test_merge.py:" in n for n in names)
    # The merged trace keeps the track under the process (same pid).
    merged = json.load(gzip.open(tmp_path / result.trace_file))["traceEvents"]
    assert len([e for e in merged if e.get("tid") == tid and e.get("pid") == pid]) == added
    assert result.processes[rec.stem].stack_summary["samples"] > 0


# -- copying a Kineto file with events first -------------------------------------------------------------
def kineto_like(events: list, base_first: bool = True, base: int = 5_000_000_000) -> str:
    members = ['"schemaVersion": 1', '"deviceProperties": [{"name": "traceEvents [not this]"}]']
    if base_first:
        members.append(f'"baseTimeNanoseconds": {base}')
    members.append('"traceEvents": [' + ",\n".join(json.dumps(e) for e in events) + "]")
    if not base_first:
        members.append(f'"baseTimeNanoseconds": {base}')
    members.append('"traceName": "t.json"')
    return "{\n  " + ",\n  ".join(members) + "\n}\n"


NEW = [{"ph": "X", "cat": "python_function", "name": f"f{i} (x.py:1)", "pid": 1, "tid": 7, "ts": 2.0 + i, "dur": 0.5,
        "args": {"file": "x.py", "line": 1, "samples": 1, "depth": 0}} for i in range(3)]


@pytest.mark.parametrize("base_first", [True, False])
@pytest.mark.parametrize("existing", [0, 3])
def test_copy_with_events_handles_both_kineto_layouts_and_an_empty_event_list(tmp_path, base_first, existing):
    from sidecar.analysis import analyze_path

    events = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "pid": 1, "tid": 1, "ts": 1.0 + i, "dur": 0.5}
              for i in range(existing)]
    src = tmp_path / "t.json"
    src.write_text(kineto_like(events, base_first))
    dst = tmp_path / "out.json"
    with open(src, "rb") as f, open(dst, "wb") as out:
        assert copy_with_events(f, out, iter(NEW)) == len(NEW)
    trace = json.load(open(dst))
    assert trace["traceEvents"] == NEW + events
    assert trace["deviceProperties"] == [{"name": "traceEvents [not this]"}] and trace["baseTimeNanoseconds"] == 5_000_000_000
    analyze_path(dst)  # readable by the analyser


def test_copy_with_events_refuses_what_is_not_a_kineto_object_and_writes_nothing(tmp_path):
    for text in ('[{"ph": "X", "ts": 1}]', '{"schemaVersion": 1}', '{"traceEvents": {}}', "not json"):
        src = tmp_path / "bad.json"
        src.write_text(text)
        dst = tmp_path / "out.json"
        with open(src, "rb") as f, open(dst, "wb") as out:
            with pytest.raises(ValueError):
                copy_with_events(f, out, NEW)
        assert dst.read_bytes() == b""


def test_copy_without_events_is_a_plain_copy(tmp_path):
    src = tmp_path / "t.json"
    src.write_text(kineto_like([]))
    dst = tmp_path / "out.json"
    with open(src, "rb") as f, open(dst, "wb") as out:
        assert copy_with_events(f, out, ()) == 0
    assert dst.read_bytes() == src.read_bytes()


def test_copy_with_events_copies_a_large_trace_in_bounded_memory(tmp_path):
    import tracemalloc

    src = tmp_path / "big.json"
    event = json.dumps({"ph": "X", "cat": "cpu_op", "name": "aten::x" * 4, "pid": 1, "tid": 1, "ts": 1.0, "dur": 1.0})
    with open(src, "w") as f:
        f.write('{"schemaVersion": 1, "baseTimeNanoseconds": 0, "traceEvents": [\n')
        f.write(",\n".join([event] * 120_000))
        f.write('\n], "traceName": "big"}\n')
    assert src.stat().st_size > 10 << 20
    dst = tmp_path / "out.json"
    tracemalloc.start()
    try:
        with open(src, "rb") as f, open(dst, "wb") as out:
            copy_with_events(f, out, NEW)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20, peak  # the 1 MiB copy buffer and the head, not the file
    with open(dst, "rb") as f:
        assert json.loads(f.read())["traceName"] == "big"
