"""Issue 2 benchmark: what the plugin costs while idle, and what a capture costs while serving.

Side by side in one run, same model (the 126M local model unless --model), same load (8 concurrent
streaming clients):
  (a) throughput and inter-token latency with the plugin installed and idle vs disabled
      (SIDECAR_DISABLE=1: same install, nothing patched), alternating A/B rounds; target ratio >= 0.99
  (b) the worst inter-token gap clients see during a 5-step capture through the sidecar vs vLLM's
      built-in /start_profile with max_iterations=5 (its defaults, and with stacks off);
      target: under 100 ms and at most a tenth of vLLM's.

python benchmarks/bench_capture.py [--model DIR] [--rounds 2] [--seconds 20] [--out bench-results/capture.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from sidecar.cli.client import SidecarClient  # noqa: E402
from sidecar.cli.make_model import build_model  # noqa: E402
from sidecar.devtools.traffic import LoadResult, run_load  # noqa: E402
from sidecar_vllm.devtools import VllmStack as Stack  # noqa: E402

CONCURRENCY = 8
MAX_TOKENS = 64


def load_for(stack: Stack, seconds: float) -> LoadResult:
    return asyncio.run(run_load(stack.server_url, stack.served_name, concurrency=CONCURRENCY,
                                duration_s=seconds, max_tokens=MAX_TOKENS))


class LoadThread(threading.Thread):
    def __init__(self, stack: Stack, seconds: float) -> None:
        super().__init__(daemon=True)
        self.stack, self.seconds, self.result = stack, seconds, None

    def run(self) -> None:
        self.result = load_for(self.stack, self.seconds)


def measure_steady(stack: Stack, seconds: float) -> dict:
    load_for(stack, 3)  # warm-up
    result = load_for(stack, seconds)
    return {"throughput_tok_s": result.throughput, "mean_itl_ms": result.mean_itl_ms(),
            "requests": len(result.results), "failures": len(result.failures)}


def stall_during(stack: Stack, trigger, seconds: float = 14.0) -> dict:
    """Run load, call ``trigger()`` (returns when the capture is over) at 5 s, and compare the
    worst gap inside the capture window with the worst gap in an equally long window before it."""
    lt = LoadThread(stack, seconds)
    lt.start()
    time.sleep(5)
    t0 = time.time()
    info = trigger()
    t1 = time.time() + 0.5  # tokens delayed by the capture arrive just after it ends
    lt.join()
    result = lt.result
    return {
        "capture_window_s": round(t1 - t0, 3),
        "max_gap_ms_during_capture": round(result.max_gap_ms(t0, t1), 2),
        "max_gap_ms_before_capture": round(result.max_gap_ms(t0 - (t1 - t0), t0), 2),
        "mean_itl_ms": round(result.mean_itl_ms(), 2),
        "failures": len(result.failures),
        **info,
    }


def sidecar_capture(stack: Stack) -> dict:
    client = SidecarClient(stack.sidecar_url)
    status = client.wait(client.start(5)["id"], timeout=120)
    return {"state": status["state"], "trace_bytes": status["trace_bytes"]}


def vllm_builtin_capture(stack: Stack, trace_dir: Path) -> dict:
    req = urllib.request.Request(f"{stack.server_url}/start_profile", data=json.dumps({"max_iterations": 5}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(req, timeout=600).read()
    deadline = time.time() + 300
    files: list[Path] = []
    while time.time() < deadline:  # done when the rank file exists and stopped growing
        files = [f for f in trace_dir.rglob("*.pt.trace.json*") if f.is_file()]
        if files:
            size = sum(f.stat().st_size for f in files)
            time.sleep(0.3)
            if size == sum(f.stat().st_size for f in files) and size > 0:
                break
        time.sleep(0.05)
    return {"files": len(files), "trace_bytes": sum(f.stat().st_size for f in files)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "126m")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "capture.json")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").exists():
        print(f"bench: building the 126M model in {args.model}", flush=True)
        build_model(args.model, size="126m")
    work = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    dtype = "bfloat16" if "126m" in args.model.name else "float32"
    report: dict = {"model": str(args.model), "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS, "rounds": []}

    # (a) idle overhead, A/B alternating so drift hits both sides.
    for r in range(args.rounds):
        for variant in ("disabled", "idle"):
            with Stack(model_dir=args.model, work_dir=work / f"{variant}{r}", dtype=dtype,
                       plugin_enabled=(variant == "idle")) as stack:
                if variant == "idle":
                    stack.start_sidecar()
                stack.start_server(timeout=600)
                if variant == "idle":
                    stack.wait_for_processes(3)
                m = measure_steady(stack, args.seconds)
                m.update(variant=variant, round=r)
                report["rounds"].append(m)
                print(f"bench: round {r} {variant:<8} {m['throughput_tok_s']:8.1f} tok/s  ITL {m['mean_itl_ms']:6.2f} ms", flush=True)

                if variant == "idle" and r == args.rounds - 1:
                    # (b1) the worst client-visible gap during a sidecar capture, same server
                    report["sidecar_capture"] = stall_during(stack, lambda: sidecar_capture(stack))
                    print(f"bench: sidecar capture {report['sidecar_capture']}", flush=True)

    # (b2) vLLM's built-in profiler with its defaults (stacks on) and with stacks off.
    for name, with_stack in (("vllm_builtin_default", True), ("vllm_builtin_no_stack", False)):
        tdir = work / f"{name}-traces"
        cfg = {"profiler": "torch", "torch_profiler_dir": str(tdir), "torch_profiler_with_stack": with_stack}
        with Stack(model_dir=args.model, work_dir=work / name, dtype=dtype, plugin_enabled=False,
                   server_args=("--profiler-config", json.dumps(cfg))) as stack:
            stack.start_server(timeout=600)
            load_for(stack, 3)
            report[name] = stall_during(stack, lambda: vllm_builtin_capture(stack, tdir))
            print(f"bench: {name} {report[name]}", flush=True)

    def med(variant: str, key: str) -> float:
        return statistics.median(m[key] for m in report["rounds"] if m["variant"] == variant)

    ours, theirs = report["sidecar_capture"], report["vllm_builtin_default"]
    report["ratios"] = {
        "throughput_idle_over_disabled": round(med("idle", "throughput_tok_s") / med("disabled", "throughput_tok_s"), 4),
        "itl_disabled_over_idle": round(med("disabled", "mean_itl_ms") / med("idle", "mean_itl_ms"), 4),
        "capture_gap_ours_over_vllm_default": round(ours["max_gap_ms_during_capture"] / theirs["max_gap_ms_during_capture"], 4),
        "capture_gap_ours_over_vllm_no_stack": round(ours["max_gap_ms_during_capture"] / report["vllm_builtin_no_stack"]["max_gap_ms_during_capture"], 4),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    rt = report["ratios"]
    print()
    print("capture benchmark (8 streaming clients, side by side in this run)")
    print(f"  idle plugin vs disabled: throughput ratio {rt['throughput_idle_over_disabled']:.4f} (target >= 0.99), "
          f"ITL ratio {rt['itl_disabled_over_idle']:.4f}")
    print(f"  worst gap during a 5-step capture: sidecar {ours['max_gap_ms_during_capture']:.1f} ms "
          f"(before: {ours['max_gap_ms_before_capture']:.1f} ms) vs vLLM built-in {theirs['max_gap_ms_during_capture']:.1f} ms "
          f"(stacks off: {report['vllm_builtin_no_stack']['max_gap_ms_during_capture']:.1f} ms); "
          f"ratio {rt['capture_gap_ours_over_vllm_default']:.3f} (target <= 0.1, and < 100 ms)")
    print(f"  results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
