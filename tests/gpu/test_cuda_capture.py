"""A capture on an engine whose worker runs on the GPU: CUDA kernels in the merged trace, on the worker's
clock, and in the analysis; the per-step readback shows as a sync."""

import gzip
import json

PER_STEP = 5


def _events(host, status) -> list[dict]:
    return json.loads(gzip.decompress(host.client.get_bytes(status["trace"])))["traceEvents"]


def _capture(host, **params) -> dict:
    started = host.client.start(PER_STEP, **params)
    status = host.client.wait(started["id"], timeout=180)
    assert status["state"] == "done", status
    return status


def test_a_capture_records_the_workers_kernels_and_the_analysis_reads_them(gpu_host):
    with gpu_host() as host:
        procs = host.standard_engine("--planted-sync")
        assert {p["role"]: p["cuda"] for p in procs} == {"api_server": False, "engine_core": False, "worker": True}
        status = _capture(host)
        worker = next(p for p in status["processes"] if p["role"] == "worker")
        events = _events(host, status)

        kernels = [e for e in events if e.get("cat") == "kernel"]
        assert kernels, "no CUDA kernel in the merged trace"
        assert any("gemm" in e["name"].lower() for e in kernels), sorted({e["name"] for e in kernels})[:10]
        steps = [e for e in events if e.get("pid") == worker["pid"] and e.get("name", "").startswith("ProfilerStep#")]
        assert len(steps) == PER_STEP
        # The GPU's events are on the worker's clock: each step's readback waits for its products, so every
        # kernel ends inside the recorded steps (1 ms of slack for the last one's completion record).
        first = min(float(e["ts"]) for e in steps)
        last = max(float(e["ts"]) + float(e["dur"]) for e in steps)
        outside = [e for e in kernels if float(e["ts"]) < first - 1000 or float(e["ts"]) + float(e["dur"]) > last + 1000]
        assert not outside, f"{len(outside)} of {len(kernels)} kernels outside the steps [{first}, {last}]"

        summary = host.client.summary(status["id"])
        gpu = summary["gpu"]
        assert gpu["kernel_count"] >= 2 * PER_STEP and gpu["busy_fraction"] > 0.2, gpu
        assert "gemm" in gpu["top_kernels"][0]["name"].lower(), gpu["top_kernels"][0]
        worker_steps = [s for s in summary["steps"] if s["kernel_count"] > 0]
        assert len(worker_steps) == PER_STEP, summary["steps"]
        readbacks = [site for sync in summary["syncs"] for site in sync["sites"] if "aten::item" in site["stack"]]
        assert readbacks and sum(site["count"] for site in readbacks) >= PER_STEP, summary["syncs"]


def test_activities_cpu_leaves_the_gpu_out(gpu_host):
    with gpu_host() as host:
        host.standard_engine("--planted-sync")
        status = _capture(host, activities="cpu")
        events = _events(host, status)
        assert not [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        assert any(e.get("cat") == "cpu_op" for e in events)


def test_python_stacks_on_a_cuda_worker(gpu_host):
    with gpu_host() as host:
        host.standard_engine("--planted-sync")
        for mode in ("sampled", "traced"):
            status = _capture(host, stacks=mode)
            worker = next(p for p in status["processes"] if p["role"] == "worker")
            assert worker["stacks"] == mode, worker
            events = _events(host, status)
            assert any(e.get("cat") == "kernel" for e in events), mode
            python = [e for e in events if e.get("cat") == "python_function" and e.get("pid") == worker["pid"]]
            assert any("fake_engine.py" in e["name"] for e in python), (mode, sorted({e["name"] for e in python})[:10])


def test_a_capture_with_shapes_recorded_a_session_per_step_keeps_every_steps_kernels(gpu_host):
    """record_shapes makes each process record one profiler session per step, joined into one trace
    (sidecar/probe/capture/trace_parts.py): on CUDA each session's stop flushes its kernels, which must all
    be there, each inside the step that launched it."""
    with gpu_host() as host:
        host.standard_engine("--planted-sync")
        status = _capture(host, record_shapes=True)
        worker = next(p for p in status["processes"] if p["role"] == "worker")
        events = _events(host, status)
        steps = sorted((e for e in events if e.get("pid") == worker["pid"]
                        and e.get("name", "").startswith("ProfilerStep#")), key=lambda e: float(e["ts"]))
        assert [e["name"] for e in steps] == [f"ProfilerStep#{k}" for k in range(PER_STEP)]
        kernels = [e for e in events if e.get("cat") == "kernel"]
        for s in steps:  # 1 ms of slack for a kernel's completion record, as above
            begin, end = float(s["ts"]) - 1000, float(s["ts"]) + float(s["dur"]) + 1000
            inside = [k for k in kernels if begin <= float(k["ts"]) <= end]
            assert any("gemm" in k["name"].lower() for k in inside), (s["name"], len(kernels))
        assert any("Input Dims" in e.get("args", {}) for e in events
                   if e.get("pid") == worker["pid"] and e.get("cat") == "cpu_op")
