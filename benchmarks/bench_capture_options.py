"""Issue 15 benchmark: the stall a 5-step capture adds to serving, for every capture option, side by
side with vLLM's built-in profiler with its default stacks (torch.profiler's ``with_stack``).

One vLLM server with the plugin and the sidecar, 8 streaming clients; for each option set a capture
of 5 steps; the stall it adds is the worst inter-token gap clients see during the capture minus the
worst gap in an equally long window just before it. Then a server without the plugin and vLLM's
``/start_profile`` with ``max_iterations=5`` and its defaults (stacks on), the same measure. Targets
(issue 15): every option under 100 ms added; stacks at most a tenth of vLLM's stacks.

Also per option: the capture's trace size, its end-to-end time (start to summary), and for sampled
stacks the sampler's CPU time per recorded step in the engine core and the worker, and in every
process its samples and its achieved / target rate (the API server's is capped, sidecar/probe/capture/profiler.py). And where each
round's worst gap came from (capture_anatomy.py): the engine core's and the worker's steps it spans,
named by their place in the capture (start, recorded, stop, after the stop while exporting), from the
flight recorder, beside the capture's timeline.

The clients start 0.7 s apart (``--stagger``), as in steady serving. Started together, as before
2026-11-26, they stay in step: all eight send their next prompt in the same engine step, one prefill
step of about 2.5 typical steps every 64 tokens (about 5.5 s here), and with the capture 5 s in,
that step fell inside the capture's window and not the window before it, round after round: it read
as 100-170 ms of "stall" that no capture caused. The option ``no capture (control)`` measures the
same windows with no capture (``--control-s`` long): what the measure reads when nothing is captured.

The model runs in float32 unless --dtype says otherwise: on a CPU without native bf16 the 126M model
in bf16 is several times slower per token, and a slow step hides stalls in ordinary gaps.

python benchmarks/bench_capture_options.py [--model DIR] [--dtype float32] [--rounds 1] [--only NAMES] [--stagger 0.7] [--skip-vllm] [--out bench-results/capture_options.json]
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
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "plugins")]

from bench_capture import CONCURRENCY, MAX_TOKENS, load_for  # noqa: E402
from capture_anatomy import StatePoller, anatomy, describe, worst_gap  # noqa: E402
from sidecar.devtools.traffic import run_load  # noqa: E402
from sidecar.cli.client import SidecarClient  # noqa: E402
from sidecar.cli.make_model import build_model  # noqa: E402
from sidecar_vllm.devtools import VllmStack as Stack  # noqa: E402

CONTROL = "no capture (control)"
OPTIONS: dict[str, dict] = {
    CONTROL: {},
    "none": {},
    "none (engine core and worker only)": {"processes": "engine_core,worker"},
    "stacks=sampled": {"stacks": "sampled"},
    "stacks=sampled (engine core and worker only)": {"stacks": "sampled", "processes": "engine_core,worker"},
    "stacks=traced": {"stacks": "traced"},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_flops": {"with_flops": True},
    "all (sampled stacks)": {"stacks": "sampled", "record_shapes": True, "profile_memory": True, "with_flops": True},
}
TARGET_MS = 100.0


def added(m: dict) -> float:
    return round(max(0.0, m["max_gap_ms_during_capture"] - m["max_gap_ms_before_capture"]), 2)


def sidecar_capture(stack: Stack, params: dict, poller: StatePoller | None = None) -> dict:
    client = SidecarClient(stack.sidecar_url)
    status = client.wait(client.start(5, **params)["id"], timeout=300, on_poll=poller)
    out = {"state": status["state"], "trace_bytes": status["trace_bytes"],
           "end_to_end_s": round((status["finished_at"] or 0) - status["created_at"], 2)}
    for p in status["processes"]:
        out[f"step_thread_ms[{p['role']}]"] = p.get("step_thread_ms")
        out[f"export_ms[{p['role']}]"] = p.get("export_ms")
        s = p.get("stack_summary")
        if s and p["steps_recorded"]:
            out[f"sampler_cpu_ms_per_step[{p['role']}]"] = round(1000 * s["sampler_cpu_s"] / p["steps_recorded"], 2)
        if s and "samples" in s:  # the API server too: its event loop, sampled at its capped rate
            out[f"samples[{p['role']}]"] = s["samples"]
            out[f"stack_hz[{p['role']}]"] = f"{s.get('achieved_hz')}/{s.get('target_hz')}"  # achieved / asked of it
    out["status"] = status
    return out


class StaggeredLoad(threading.Thread):
    """The benchmark's load on a thread: ``CONCURRENCY`` streaming clients, client ``n`` starting
    ``n * stagger`` seconds after the first (traffic.run_load)."""

    def __init__(self, stack: Stack, seconds: float, stagger: float) -> None:
        super().__init__(daemon=True)
        self.stack, self.seconds, self.stagger, self.result = stack, seconds, stagger, None

    def run(self) -> None:
        self.result = asyncio.run(run_load(self.stack.server_url, self.stack.served_name, concurrency=CONCURRENCY,
                                           duration_s=self.seconds, max_tokens=MAX_TOKENS, stagger_s=self.stagger))


def window_round(stack: Stack, trigger, args: argparse.Namespace, anatomy_of: bool = False) -> dict:
    """One capture by ``trigger`` under load: the worst gap during it (from the start request to
    0.5 s after it returned) against the worst gap in an equally long window just before it, with
    every client started 5 s before. With ``anatomy_of`` (ours), where the worst gap came from:
    the load's token arrivals, the capture's status over time, the flight recorder."""
    ramp = args.stagger * (CONCURRENCY - 1)  # the last client's start
    lt = StaggeredLoad(stack, args.seconds + ramp, args.stagger)
    lt.start()
    time.sleep(5 + ramp)
    t0 = time.time()
    poller = StatePoller() if anatomy_of else None
    info = trigger(poller)
    t1 = time.time() + 0.5  # tokens delayed by the capture arrive just after it ends
    lt.join()
    result = lt.result
    status = info.pop("status", None)
    out = {
        "capture_window_s": round(t1 - t0, 3),
        "max_gap_ms_during_capture": round(result.max_gap_ms(t0, t1), 2),
        "max_gap_ms_before_capture": round(result.max_gap_ms(t0 - (t1 - t0), t0), 2),
        "mean_itl_ms": round(result.mean_itl_ms(), 2),
        "failures": len(result.failures),
        **info,
    }
    if anatomy_of:
        recorder = SidecarClient(stack.sidecar_url).request("GET", "/recorder", {"seconds": round(time.time() - t0 + 12, 1)})
        out["anatomy"] = anatomy(status or {}, recorder, worst_gap(result, t0, t1), t0, poller.seen)
    return out


def control(seconds: float) -> dict:
    """No capture at all: the same window, as long as a plain capture takes. What this measure reads
    when nothing is captured is the floor of the measure itself, not a capture's cost."""
    time.sleep(seconds)
    return {"state": "no capture", "trace_bytes": 0, "end_to_end_s": seconds}


def measure(stack: Stack, trigger, args: argparse.Namespace, label: str) -> dict:
    """``args.rounds`` captures by ``trigger`` under load: every round's figures and the median stall."""
    runs = []
    for _ in range(args.rounds):
        m = trigger()
        m["added_ms"] = added(m)
        runs.append(m)
        shown = {k: v for k, v in m.items() if k != "anatomy"}
        print(f"bench: {label} {shown}", flush=True)
        if "anatomy" in m:
            print(describe(m["anatomy"]), flush=True)
    return {"runs": runs, "added_ms": statistics.median(r["added_ms"] for r in runs)}


def _post(url: str, body: dict | None = None) -> None:
    req = urllib.request.Request(url, data=json.dumps(body or {}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=600).read()


def vllm_capture(stack: Stack, trace_dir: Path) -> dict:
    """vLLM's /start_profile with max_iterations=5; done when a new trace file stopped growing. Then
    /stop_profile, so that the next round may start one (vLLM refuses a start while it profiles)."""
    before = set(trace_dir.rglob("*.pt.trace.json*")) if trace_dir.exists() else set()
    _post(f"{stack.server_url}/start_profile", {"max_iterations": 5})
    deadline, new = time.time() + 300, []
    while time.time() < deadline:
        new = [f for f in trace_dir.rglob("*.pt.trace.json*") if f.is_file() and f not in before]
        if new:
            size = sum(f.stat().st_size for f in new)
            time.sleep(0.3)
            if size and size == sum(f.stat().st_size for f in new):
                break
        time.sleep(0.05)
    try:
        _post(f"{stack.server_url}/stop_profile")
    except urllib.error.HTTPError:
        pass  # already stopped after its max_iterations
    return {"files": len(new), "trace_bytes": sum(f.stat().st_size for f in new)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "126m")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--rounds", type=int, default=1, help="captures per option (the median is reported)")
    parser.add_argument("--seconds", type=float, default=14.0, help="load per measurement")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "capture_options.json")
    parser.add_argument("--only", default=None, help="comma-separated option names to measure (default: all)")
    parser.add_argument("--stagger", type=float, default=0.7,
                        help="seconds between the clients' starts (0: all at once, as before 2026-11-26)")
    parser.add_argument("--control-s", type=float, default=1.3,
                        help="the control's window: about as long as a plain capture takes")
    parser.add_argument("--skip-vllm", action="store_true",
                        help="leave out vLLM's built-in profiler (no ratio; for a quick look at ours)")
    args = parser.parse_args(argv)
    options = {k: v for k, v in OPTIONS.items() if args.only is None or k in args.only.split(",")}
    if not (args.model / "config.json").exists():
        print(f"bench: building the 126M model in {args.model}", flush=True)
        build_model(args.model, size="126m")
    work = Path(tempfile.mkdtemp(prefix="sidecar-bench-options-"))
    report: dict = {"model": str(args.model), "dtype": args.dtype, "concurrency": CONCURRENCY,
                    "max_tokens": MAX_TOKENS, "ours": {}, "vllm": {}}

    with Stack(model_dir=args.model, work_dir=work / "ours", dtype=args.dtype) as stack:
        stack.start_sidecar()
        stack.start_server(timeout=600)
        stack.wait_for_processes(3)
        load_for(stack, 3)  # warm-up
        for name, params in options.items():
            if name == CONTROL:
                trigger = lambda: window_round(stack, lambda _poller: control(args.control_s), args)  # noqa: E731
            else:
                trigger = lambda: window_round(  # noqa: E731
                    stack, lambda poller: sidecar_capture(stack, params, poller), args, anatomy_of=True)
            report["ours"][name] = measure(stack, trigger, args, f"ours {name:<22}")

    if args.skip_vllm:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        for name, r in report["ours"].items():
            print(f"  {name:<24} stall added {r['added_ms']:>7.1f} ms (rounds: {[x['added_ms'] for x in r['runs']]})")
        print(f"  results: {args.out}")
        return 0
    tdir = work / "vllm-traces"
    cfg = {"profiler": "torch", "torch_profiler_dir": str(tdir)}  # vLLM's defaults: with_stack on
    with Stack(model_dir=args.model, work_dir=work / "vllm", dtype=args.dtype, plugin_enabled=False,
               server_args=("--profiler-config", json.dumps(cfg))) as stack:
        stack.start_server(timeout=600)
        load_for(stack, 3)
        report["vllm"]["with_stack (default)"] = measure(
            stack, lambda: window_round(stack, lambda _poller: vllm_capture(stack, tdir), args), args,
            "vLLM built-in (with_stack)")

    theirs = report["vllm"]["with_stack (default)"]["added_ms"]
    ours_stacks = report["ours"].get("stacks=sampled", {}).get("added_ms")
    report["ratios"] = {"stacks_ours_over_vllm": round(ours_stacks / theirs, 4) if theirs and ours_stacks is not None else None}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))

    print()
    print(f"capture options benchmark ({CONCURRENCY} streaming clients, {args.dtype}, one run, side by side)")
    print(f"  {'option':<24} {'stall added':>12} {'trace':>10} {'end to end':>11}  target < {TARGET_MS:.0f} ms")
    for name, r in report["ours"].items():
        last = r["runs"][-1]
        verdict = "ok" if r["added_ms"] < TARGET_MS else "OVER"
        print(f"  {name:<24} {r['added_ms']:>9.1f} ms {last['trace_bytes'] / 2**20:>7.2f} MiB "
              f"{last['end_to_end_s']:>9.1f} s  {verdict}")
    print(f"  {'vLLM built-in, stacks':<24} {theirs:>9.1f} ms")
    ratio = report["ratios"]["stacks_ours_over_vllm"]
    print(f"  stacks: ours / vLLM's = {ratio if ratio is not None else 'n/a'} (target <= 0.1)")
    print(f"  results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
