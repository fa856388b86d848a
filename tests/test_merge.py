"""Merging per-process Kineto traces into one timeline."""

import gzip
import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sidecar.service.merge import DEVICE_PID_BASE, finalize_capture

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

    @property
    def sort_key(self) -> tuple:  # as sidecar.protocol.ProcessIdentity.sort_key
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
