"""An nsys capture with Nsight Systems really attached: the GPU stand-in's worker runs under
``nsys profile --capture-range=cudaProfilerApi`` (docs/gpu.md, "Nsight Systems ranges"), the sidecar's
``backend=nsys`` capture opens and closes the range at its aligned steps, and nsys writes a report whose
NVTX ranges are the capture's steps. Needs ``nsys`` on PATH (a CUDA host without Nsight Systems fails this
test, saying so: the nsys path cannot be checked there)."""

import shutil
import subprocess
import time

STEPS = 4


def test_nsys_records_the_captures_steps_between_the_probes_start_and_stop(gpu_host, tmp_path):
    nsys = shutil.which("nsys")
    assert nsys, "nsys (Nsight Systems) is not on PATH: install it to check the nsys backend on this host"
    report = tmp_path / "worker"
    prefix = (nsys, "profile", "--trace=cuda,nvtx", "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
              "--force-overwrite=true", "-o", str(report))
    with gpu_host() as host:
        host.standard_engine("--cuda-graph", "--phases", worker_prefix=prefix)
        started = host.client.start(STEPS, backend="nsys")
        status = host.client.wait(started["id"], timeout=180)
        assert status["state"] == "done", status
        [worker] = status["processes"]
        assert worker["nsys"]["cuda_profiler"] and worker["nsys"]["step_ranges"] == STEPS, worker
        # nsys writes its report once the range has ended; the engine goes on serving meanwhile.
        written = report.with_suffix(".nsys-rep")
        deadline = time.monotonic() + 180
        while not written.exists():
            assert time.monotonic() < deadline, f"no {written} after the range ended: {list(tmp_path.iterdir())}"
            time.sleep(1)
        first = worker["first_step"]
        ranges = _nvtx_ranges(nsys, written)
        assert {f"step {first + i}" for i in range(STEPS)} <= ranges, sorted(ranges)[:20]
        assert "forward (fake: forward)" in ranges, sorted(ranges)[:20]


def _nvtx_ranges(nsys: str, report) -> set[str]:
    """The NVTX range names of ``report``, from ``nsys stats`` (its NVTX summary: ``nvtx_sum``, older
    versions ``nvtxsum``), as CSV."""
    for name in ("nvtx_sum", "nvtxsum"):
        done = subprocess.run([nsys, "stats", "--report", name, "--format", "csv", str(report)],
                              capture_output=True, text=True, timeout=300)
        if done.returncode == 0 and "step " in done.stdout:
            return {field.strip('":') for line in done.stdout.splitlines() for field in line.split(",")
                    if field.strip('"').startswith(("step ", "forward", "prepare"))}
    raise AssertionError(f"nsys stats found no step range in {report}: {done.stderr[-2000:] or done.stdout[-2000:]}")
