"""On a CUDA host: the stall a 5-step capture adds to the step loop of a stand-in engine whose worker
runs on the GPU, for every capture option; the first capture (CUPTI's start-up) apart.

The stand-in (tests/fake_engine.py, the processes of tests/gpu/host.py): an API server, an engine
core stepping every 2 ms and a worker whose step is two 4096x4096 fp32 products and a sum read back
with `.item()` (vLLM reads its sampled tokens back every step the same way). The stall is read from the
flight recorder (GET /recorder): per process, the longest interval between the starts of two working
steps while the capture runs (start to its final state), minus the longest in the 2 s before it. No
vLLM here (this host has no vLLM for CUDA); docs/benchmarks.md has the same measure on real vLLM on CPU.

Captures record the API server and the worker (`processes=api_server,worker`; the option without the
API server, `processes=worker`): the stand-in's engine core and worker step on their own clocks, so
their working-step counts drift apart, while the sidecar's common start step assumes, as in vLLM, that
every process of an engine counts the same steps (sidecar/service/jobs/arming.py). Captured together, each
capture would wait longer for the worker to reach the engine core's count.

python benchmarks/bench_gpu_capture.py [--rounds 3] [--out bench-results/gpu_capture.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "plugins"), str(ROOT / "tests" / "gpu")]

import torch  # noqa: E402

from bench_capture_options import CONTROL, OPTIONS, TARGET_MS  # noqa: E402
from host import GpuHost  # noqa: E402

BEFORE_S = 2.0
CONTROL_S = 0.5  # about a 5-step capture's time from start to done on the stand-in
STEP_ROLES = ("worker",)


def bench_options() -> dict[str, dict]:
    """bench_capture_options' options, on the API server and the worker (the module's docstring says why);
    those of the engine core and the worker there, on the worker alone here."""
    out = {}
    for label, params in OPTIONS.items():
        if "processes" in params:
            out[label.replace("engine core and worker only", "worker only")] = {**params, "processes": "worker"}
        else:
            out[label] = {**params, "processes": "api_server,worker"}
    return out


def longest_intervals(recorder: dict, since_ns: int, until_ns: int) -> dict[str, float]:
    """Per step-driven role: the longest start-to-start interval between working steps starting in the window (ms)."""
    out: dict[str, float] = {}
    for proc in recorder["processes"]:
        role = proc["process"]["role"]
        if role not in STEP_ROLES:
            continue
        starts = sorted(s["start_ns"] for s in proc["steps"] if s["working"])
        inside = [b - a for a, b in zip(starts, starts[1:]) if since_ns <= b <= until_ns]
        out[role] = round(max(inside) / 1e6, 2) if inside else float("nan")
    return out


def one_capture(host: GpuHost, params: dict, control: bool = False) -> dict:
    """``control``: the same windows with no capture in the second (a wait as long as a capture takes), to
    read what the measure itself says when nothing is captured."""
    time.sleep(BEFORE_S)
    t0 = time.time_ns()
    if control:
        time.sleep(CONTROL_S)
        status = {"state": "none", "trace_bytes": 0}
    else:
        status = host.client.wait(host.client.start(5, **params)["id"], timeout=120)
    t1 = time.time_ns()
    recorder = host.client.request("GET", "/recorder", {"seconds": str(BEFORE_S + (t1 - t0) / 1e9 + 2)})
    before = longest_intervals(recorder, t0 - int(BEFORE_S * 1e9), t0)
    during = longest_intervals(recorder, t0, t1)
    added = {role: round(max(0.0, during[role] - before[role]), 2) for role in during}
    return {"state": status["state"], "seconds": round((t1 - t0) / 1e9, 2), "trace_bytes": status["trace_bytes"],
            "before_ms": before, "during_ms": during, "added_ms": added, "worst_added_ms": max(added.values())}


def write(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "gpu_capture.json")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gpu_capture: needs a CUDA device", file=sys.stderr)
        return 2
    results: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": args.rounds, "options": {}}
    with tempfile.TemporaryDirectory() as work, GpuHost(Path(work) / "host") as host:
        host.standard_engine("--planted-sync")
        results["first_capture"] = one_capture(host, {"processes": "api_server,worker"})  # the first in these processes: CUPTI starts up
        print(f"first capture: {results['first_capture']}", flush=True)
        for label, params in bench_options().items():
            rounds = []
            for _ in range(args.rounds):
                rounds.append(one_capture(host, params, control=label == CONTROL))
                print(f"{label}: {rounds[-1]}", flush=True)
            results["options"][label] = {"rounds": rounds,
                                         "median_added_ms": statistics.median(r["worst_added_ms"] for r in rounds)}
            write(args.out, results)  # what is measured so far survives an interrupted run
    write(args.out, results)
    first = results["first_capture"]
    print(f"{results['device']}, torch {results['torch']}: stall added to the stand-in's step loop by a 5-step capture")
    print(f"  first capture (CUPTI start-up) {first['worst_added_ms']:8.1f} ms  ({first['added_ms']})")
    for label, r in results["options"].items():
        worst = [x["worst_added_ms"] for x in r["rounds"]]
        mark = "ok" if r["median_added_ms"] < TARGET_MS else "over"
        print(f"  {label:36s} {r['median_added_ms']:8.1f} ms  rounds {min(worst)}-{max(worst)}  "
              f"{r['rounds'][0]['seconds']} s, {r['rounds'][0]['trace_bytes']} B  [{mark} < {TARGET_MS:.0f} ms]")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
