"""The memory-snapshot job in one process (sidecar/probe/memory_job.py), driven step by step with the
allocator stand-in (tests/fake_cuda_allocator.py): exactly N working steps from the start step, the
history on only while recording, the snapshot pickled under the probe's root within its byte bound and
summarised off the step thread; and the probe's own refusals (``Probe._arm_memory``)."""

from __future__ import annotations

import json
import os
import pickle
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fake_cuda_allocator import STEP_ALLOCS, WEIGHT_BYTES, FakeAllocator, step_work
from sidecar.common.protocol import MEMORY_EXTRA, Fetch, MemoryArm, MemoryReport, MemorySpec
from sidecar.common.protocol_codec import decode_from_probe, decode_from_sidecar, encode
from sidecar.probe import Probe
from sidecar.probe.capture.limits import ProbeLimits
from sidecar.probe.memory_job import MemorySnapshot


class Run:
    """A job, its allocator and its reports; ``step(work)`` is one engine step."""

    def __init__(self, tmp_path, steps=3, max_entries=10_000, max_bytes=64 * 2**20, allocator=None):
        self.allocator = allocator or FakeAllocator()
        self.allocator.alloc(WEIGHT_BYTES, 5, "load_weights")
        step_work(self.allocator)
        self.reports: list[MemoryReport] = []
        self.ended = threading.Event()
        self.exporter = ThreadPoolExecutor(max_workers=1)
        self.path = str(tmp_path / "captures" / "g20261128-000000-abcdef" / "raw" / "worker-rank0-pid1.memory.pickle")
        spec = MemorySpec(id="g20261128-000000-abcdef", steps=steps, max_entries=max_entries, max_bytes=max_bytes)
        self.job = MemorySnapshot(spec, self._report, self.allocator, self.exporter, self.path, max_bytes)
        self.count = 0  # the probe's working steps

    def _report(self, msg: MemoryReport) -> None:
        decode_from_probe(encode(msg))  # every report is a valid frame
        self.reports.append(msg)
        if msg.state in ("done", "failed"):
            self.ended.set()

    def step(self, work: bool = True) -> None:
        self.job.on_step_begin(work, self.count)
        if work:
            step_work(self.allocator)
        self.job.on_step_end(work)
        self.count += work

    def final(self) -> MemoryReport:
        assert self.ended.wait(30), [r.state for r in self.reports]
        self.exporter.shutdown(wait=True)
        return self.reports[-1]


def test_exactly_n_working_steps_from_the_start_step(tmp_path):
    run = Run(tmp_path, steps=3, max_entries=5000)
    run.job.report_armed(0)
    run.step()  # before begin: nothing
    run.job.begin(4)
    for _ in range(3):
        run.step()
        assert not run.allocator.recording, "not before the start step"
    run.step(work=False)  # an idle step is neither recorded nor counted
    assert not run.allocator.recording
    for _ in range(3):
        run.step()
        assert run.allocator.recording or run.job.finished
    run.step()  # after the window
    done = run.final()
    assert [r.state for r in run.reports] == ["armed", "recording", "done"]
    assert run.reports[1].first_step == 4 and done.first_step == 4 and done.steps_recorded == 3
    assert run.allocator.starts == [5000] and run.allocator.stops == 1 and run.allocator.snapshots == 1
    assert not run.allocator.recording, "the history is off once the snapshot is taken"
    s = done.summary
    assert s["allocations"] == 3 * len(STEP_ALLOCS), "the steps before and after are not in it"
    assert [r["allocations"] for r in s["steps"]] == [len(STEP_ALLOCS)] * 3
    assert s["end"]["allocated_bytes"] == WEIGHT_BYTES and done.entries == s["entries"]
    # The raw snapshot: the allocator's own dictionary, pickled where the probe said.
    assert done.file == run.path and done.bytes == os.path.getsize(run.path) and s["raw_file"]["kept"]
    with open(run.path, "rb") as f:
        raw = pickle.load(f)  # written by this test's own job: safe to load here
    assert set(raw) >= {"segments", "device_traces"} and len(raw["device_traces"][0]) == s["entries"]


def test_a_stop_ends_it_at_the_next_step_boundary_keeping_what_was_recorded(tmp_path):
    run = Run(tmp_path, steps=10)
    run.job.begin(0)
    run.step()
    assert run.job.request_stop("stopped by request") is False
    run.step()  # the boundary: closed before this step does anything
    done = run.final()
    assert done.state == "done" and done.steps_recorded == 1 and done.stop_reason == "stopped by request"
    assert run.allocator.stops == 1 and done.summary["allocations"] == len(STEP_ALLOCS)


def test_a_time_limit_ends_it_like_a_stop(tmp_path):
    run = Run(tmp_path, steps=10)
    run.job.limit_time(0.0, "SIDECAR_PROBE_MAX_CAPTURE_S=0 s limit of this process reached")
    run.job.begin(0)
    run.step()
    done = run.final()
    assert done.steps_recorded == 1 and "limit" in done.stop_reason and not run.allocator.recording


def test_a_job_stopped_while_armed_never_touches_the_allocator(tmp_path):
    run = Run(tmp_path)
    run.job.report_armed(0)
    assert run.job.request_stop("stopped by request") is True
    failed = run.final()
    assert failed.state == "failed" and "no step recorded" in failed.error
    assert run.allocator.starts == [] and run.allocator.snapshots == 0


def test_a_snapshot_that_fails_still_turns_the_history_off(tmp_path):
    run = Run(tmp_path, steps=1)
    run.allocator.fail_snapshot = RuntimeError("CUDA error: an illegal memory access")
    run.job.begin(0)
    run.step()  # the engine's step goes on: nothing raised here
    failed = run.final()
    assert failed.state == "failed" and "illegal memory access" in failed.error
    assert run.allocator.stops == 1 and not run.allocator.recording


def test_a_raw_snapshot_over_the_bound_is_not_kept_the_summary_is(tmp_path):
    run = Run(tmp_path, steps=2, max_bytes=1024)  # the pickle is about 2 KB
    run.job.begin(0)
    run.step()
    run.step()
    done = run.final()
    assert done.state == "done" and done.file is None and done.bytes == 0
    assert "over the limit of" in done.summary["raw_file"]["note"] and not done.summary["raw_file"]["kept"]
    assert done.summary["allocations"] == 2 * len(STEP_ALLOCS)
    assert not os.path.exists(run.path) and not os.path.exists(os.path.dirname(os.path.dirname(run.path)))


def test_the_frames_round_trip_and_bad_specs_are_refused():
    spec = MemorySpec(id="g20261128-000000-abcdef", steps=2, max_entries=7, max_bytes=99)
    assert decode_from_sidecar(encode(MemoryArm(spec=spec))) == MemoryArm(spec=spec)
    for bad in ({"max_entries": 0}, {"max_entries": 1_000_001}, {"steps": 0}, {"id": "../x"}, {"max_bytes": 0}):
        data = json.loads(encode(MemoryArm(spec=spec)))
        data["spec"].update(bad)
        with pytest.raises(ValueError):
            decode_from_sidecar(json.dumps(data))


@pytest.fixture
def probe_of(tmp_path):
    probes = []

    def make(cuda: bool, **kw):
        # No flight recorder: its GPU-memory column would read torch's real allocator, which a CPU build lacks.
        probe = Probe("worker", 0, endpoint="http://127.0.0.1:9", cuda_available=cuda, trace_root=tmp_path / "root",
                      recorder_steps=0, **kw)
        sent = []
        probe._link.send = sent.append
        probes.append(probe)
        return probe, sent

    yield make
    for probe in probes:
        probe.close()


def test_the_probe_refuses_without_cuda_or_over_its_step_limit(probe_of):
    probe, sent = probe_of(False, memory_allocator=FakeAllocator())
    assert probe.identity.extra[MEMORY_EXTRA] is True and probe.identity.cuda is False
    probe._on_message(MemoryArm(spec=MemorySpec(id="g20261128-000000-abcdef", steps=2)))
    [refused] = sent
    assert refused.state == "failed" and "no CUDA" in refused.error
    probe, sent = probe_of(True, memory_allocator=FakeAllocator(), limits=ProbeLimits(max_steps=1))
    probe._on_message(MemoryArm(spec=MemorySpec(id="g20261128-000000-abcdef", steps=2)))
    assert sent[0].state == "failed" and "SIDECAR_PROBE_MAX_STEPS" in sent[0].error


def test_the_probe_arms_it_in_its_second_slot_and_writes_under_its_own_root(probe_of, tmp_path):
    allocator = FakeAllocator()
    probe, sent = probe_of(True, memory_allocator=allocator)
    probe._on_message(MemoryArm(spec=MemorySpec(id="g20261128-000000-abcdef", steps=1)))
    assert sent[-1].state == "armed" and sent[-1].steps_seen == 0
    busy = MemoryArm(spec=MemorySpec(id="g20261128-000000-bbbbbb", steps=1))
    probe._on_message(busy)
    assert sent[-1].state == "failed" and "still running here" in sent[-1].error
    probe._job("g20261128-000000-abcdef").begin(0)
    probe.step_begin(True)
    step_work(allocator)
    probe.step_end(True)
    for _ in range(300):
        if sent[-1].state in ("done", "failed"):
            break
        threading.Event().wait(0.05)
    done = sent[-1]
    assert done.state == "done", done
    root = os.path.realpath(tmp_path / "root")
    assert done.file.startswith(os.path.join(root, "captures", "g20261128-000000-abcdef", "raw", "worker-rank0-pid"))
    assert done.file.endswith(".memory.pickle") and os.path.isfile(done.file)
    # The file sender hands it over (a sidecar on another host), and deletes it with its folders.
    chunk = probe._files.answer(Fetch(file=done.file))
    assert chunk.error is None and chunk.size == done.bytes and chunk.sha256
    assert not os.path.exists(os.path.dirname(os.path.dirname(done.file)))


def test_steps_that_replay_a_cuda_graph_are_counted_for_the_note(tmp_path):
    """A replay allocates nothing through the caching allocator: the job counts the steps that replayed a
    graph (sidecar/common/cuda_graphs.py) so the sidecar can say why their allocations are missing, and
    the replay method is the class's own again once the window is closed."""
    from fake_cuda_graph import StandInGraph

    from sidecar.common.cuda_graphs import GraphReplays

    run = Run(tmp_path, steps=3)
    run.job._graphs = GraphReplays(StandInGraph)  # the stand-in class instead of torch's
    graph = StandInGraph()
    graph.capture(lambda: None)
    original = StandInGraph.__dict__["replay"]
    run.job.report_armed(0)
    run.job.begin(0)
    for replay in (True, False, True):
        run.job.on_step_begin(True, run.count)
        if replay:
            graph.replay()
            graph.replay()
        else:
            step_work(run.allocator)
        run.job.on_step_end(True)
        run.count += 1
    done = run.final()
    assert (done.graph_steps, done.graph_replays) == (2, 4)
    assert done.summary["allocations"] == len(STEP_ALLOCS), "only the eager step allocated"
    assert StandInGraph.__dict__["replay"] is original
