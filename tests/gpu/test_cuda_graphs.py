"""Every job on a worker that replays a CUDA graph each step, as vLLM's decode steps do (tests/fake_engine.py
``--cuda-graph``: the step's products captured once into a ``torch.cuda.CUDAGraph`` after a warm-up on a side
stream, replayed each step; the step's ``.sum()`` and planted ``.item()`` stay outside the graph).

* a capture holds the graph's kernels, launched by ``cudaGraphLaunch``, inside the worker's steps, and the
  analysis counts them in each step;
* a sync scan still finds the planted ``.item()`` (outside the graph) and its notes say every step replayed one;
  the always-on watch finds it too;
* module timing says the hooks saw no replayed step, rather than a table of zeros alone;
* a memory snapshot ends done on the replaying worker and says its steps replayed a graph;
* the flight recorder's rows carry the allocator's bytes;
* an nsys capture (no nsys attached: cudaProfilerStart/Stop are the real calls, with no tool to collect)
  marks every step with the real NVTX calls.
"""

import gzip
import json
import time

from sidecar.common.verdicts import FINAL

from host import FAKE_ENGINE

STEPS = 4
PLANTED_LINE = next(n for n, line in enumerate(FAKE_ENGINE.read_text().splitlines(), 1) if "# PLANTED_LINE" in line)
GRAPH = ("--cuda-graph", "--planted-sync")
MODEL_GRAPH = ("--cuda-graph", "--model", "--size", "2048")


def _events(host, status) -> list[dict]:
    return json.loads(gzip.decompress(host.client.get_bytes(status["trace"])))["traceEvents"]


def _wait(host, url, timeout=180):
    deadline = time.monotonic() + timeout
    while True:
        body = host.client.request("GET", url)
        if body["state"] in FINAL:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.25)


def test_a_capture_holds_the_replayed_graphs_kernels_in_each_step(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*GRAPH)
        started = host.client.start(STEPS)
        status = host.client.wait(started["id"], timeout=180)
        assert status["state"] == "done", status
        worker = next(p for p in status["processes"] if p["role"] == "worker")
        events = _events(host, status)
        launches = [e for e in events if e.get("pid") == worker["pid"] and e.get("name") == "cudaGraphLaunch"]
        assert len(launches) >= STEPS, "one graph launch per step"
        graph_corr = {e["args"]["correlation"] for e in launches}
        graph_kernels = [e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in graph_corr]
        assert graph_kernels and any("gemm" in e["name"].lower() for e in graph_kernels), \
            sorted({e["name"] for e in graph_kernels})[:10]
        summary = host.client.summary(status["id"])
        worker_steps = [s for s in summary["steps"] if s["pid"] == worker["pid"]]
        assert len(worker_steps) == STEPS and all(s["kernel_count"] >= 2 for s in worker_steps), worker_steps
        assert "gemm" in summary["gpu"]["top_kernels"][0]["name"].lower(), summary["gpu"]["top_kernels"][0]


def test_a_sync_scan_finds_the_sync_outside_the_graph_and_says_the_steps_replayed_one(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*GRAPH)
        started = host.client.request("POST", "/sync/start", {"steps": str(STEPS)})
        scan = _wait(host, started["url"])
        assert scan["state"] == "done", scan
        hidden = [s for s in scan["sites"] if s["classification"] == "hidden"]
        assert [s["op"] for s in hidden] == ["item"] and hidden[0]["count"] == STEPS, hidden
        assert any(f"{STEPS} of {STEPS} steps replayed a CUDA graph" in note for note in scan["notes"]), scan["notes"]


def test_module_timing_says_the_hooks_saw_no_replayed_step(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*MODEL_GRAPH)
        started = host.client.start_modules(STEPS)
        job = host.client.wait(started["id"], timeout=180, path="/modules/")
        assert job["state"] == "done", job
        assert any(f"{STEPS} of {STEPS} steps replayed a CUDA graph" in note and "hooks do not run" in note
                   for note in job["notes"]), job["notes"]
        assert job["hooks_left"] == 0
        assert not any(m["calls"] for m in job["modules"]), "a replay runs no forward hook"


def test_a_memory_snapshot_on_the_replaying_worker(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*GRAPH)
        started = host.client.request("GET", "/memory/start", {"steps": "3"})
        job = _wait(host, started["url"])
        assert job["state"] == "done", job
        worker = next(p for p in job["processes"] if p["role"] == "worker")
        assert worker["state"] == "done" and worker["steps_recorded"] == 3, worker
        # A replay allocates nothing through the caching allocator: said in the notes, not left as zeros.
        assert any("3 of 3 steps replayed a CUDA graph" in n for n in job["notes"]), job["notes"]


def test_the_recorder_rows_carry_the_allocators_bytes(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*GRAPH)
        deadline = time.monotonic() + 60
        while True:
            view = host.client.request("GET", "/recorder", {"seconds": "10"})
            worker = next(p for p in view["processes"] if p["process"]["role"] == "worker")
            rows = [s for s in worker["steps"] if s.get("gpu_allocated")]
            if worker["gpu_memory_source"] in ("sampled", "step_end") and rows:
                break
            assert time.monotonic() < deadline, worker["gpu_memory_source"]
            time.sleep(0.5)
        # The worker's matrices and the graph's pool: far more than nothing, reserved at least allocated.
        assert rows[-1]["gpu_allocated"] > 4096 * 4096 * 4 and rows[-1]["gpu_reserved"] >= rows[-1]["gpu_allocated"]
        core = next(p for p in view["processes"] if p["process"]["role"] == "engine_core")
        assert core["gpu_memory_source"] is None  # the stand-in's engine core has no CUDA


def test_an_nsys_capture_marks_the_replayed_steps_with_the_real_calls(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*GRAPH)
        started = host.client.start(STEPS, backend="nsys")
        status = host.client.wait(started["id"], timeout=180)
        assert status["state"] == "done" and status["backend"] == "nsys", status
        [worker] = status["processes"]  # the API server and the CUDA-less engine core are left out
        assert worker["nsys"] == {"cuda_profiler": True, "step_ranges": STEPS, "phase_ranges": False}, worker
        assert status["trace"] is None and any("not in an nsys capture" in n for n in status["notes"])


def test_the_always_on_watch_sees_the_sync_around_the_replays(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*GRAPH, SIDECAR_SYNC_WATCH="1", SIDECAR_SYNC_WATCH_EVERY="2")
        deadline = time.monotonic() + 120
        while True:
            watch = host.client.request("GET", "/syncs/watch")
            sites = [s for s in watch["sites"] if s["file"].endswith("fake_engine.py") and s["classification"] == "hidden"]
            if sites:
                break
            assert time.monotonic() < deadline, watch
            time.sleep(0.5)
        # The planted .item() after the replay, and nothing inside the graph (a graph holds no sync).
        assert {s["line"] for s in sites} == {PLANTED_LINE}, sites
