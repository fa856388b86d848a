"""What request telemetry costs a real vLLM server: throughput and inter-token latency with the
plugin's full telemetry on, off, and with vLLM's own ``--otlp-traces-endpoint`` tracing instead.

One run starts the same server three times (126M-parameter model, bf16, 8 concurrent streaming
clients), one configuration after another and in alternating order when ``--rounds`` > 1:

  off           the plugin loaded (captures work), ``SIDECAR_TELEMETRY=0``
  sidecar       full telemetry: request span trees exported over OTLP/HTTP, request and step metrics
                pushed to the sidecar every 5 s, process samplers (the defaults a user gets)
  vllm_tracing  ``SIDECAR_TELEMETRY=0`` and vLLM's own tracing (``--otlp-traces-endpoint``, http/protobuf)

Spans of both tracing configurations go to the same minimal OTLP/HTTP sink in this process, which
counts them (a check that tracing was really on). Also measured, with no server: the per-step cost of
the worker hooks with the step recorder on, against the probe alone (the 1 ms step of the tiny model
is the harshest case). Results: bench-results/telemetry.json.

python benchmarks/bench_telemetry.py [--duration 20] [--rounds 1] [--model models/126m]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from aiohttp import web  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402

from sidecar.devtools.traffic import run_load  # noqa: E402
from sidecar_vllm.devtools import VllmStack as Stack, free_port  # noqa: E402

CONCURRENCY = 8
MAX_TOKENS = 64
CONFIGS = ("off", "sidecar", "vllm_tracing")


class OtlpSink:
    """An OTLP/HTTP trace receiver that parses and counts spans, on its own thread and loop."""

    def __init__(self) -> None:
        self.port = free_port()
        self.spans = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        threading.Thread(target=self._run, daemon=True, name="otlp-sink").start()
        self._ready.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _traces(self, request: web.Request) -> web.Response:
        body = ExportTraceServiceRequest.FromString(await request.read())
        self.spans += sum(len(ss.spans) for rs in body.resource_spans for ss in rs.scope_spans)
        return web.Response(body=b"", content_type="application/x-protobuf")

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._ready.set()
        self._loop.run_forever()


def stack_for(config: str, model: Path, work: Path, sink: OtlpSink) -> Stack:
    env: dict[str, str] = {"OTEL_SDK_DISABLED": "false"}
    args: tuple[str, ...] = ()
    if config == "off":
        env["SIDECAR_TELEMETRY"] = "0"
    elif config == "sidecar":
        env.update({"SIDECAR_TELEMETRY": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_METRICS_EXPORTER": "none"})
    elif config == "vllm_tracing":
        env.update({"SIDECAR_TELEMETRY": "0", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
        args = ("--otlp-traces-endpoint", f"{sink.url}/v1/traces")
    else:
        raise ValueError(config)
    return Stack(model_dir=model, work_dir=work / config, dtype="bfloat16", server_args=args, env=env)


def run_config(config: str, model: Path, work: Path, sink: OtlpSink, duration_s: float) -> dict:
    stack = stack_for(config, model, work, sink)
    try:
        stack.start_sidecar()
        stack.start_server()
        stack.wait_for_processes(3, timeout=60)
        warm = asyncio.run(run_load(stack.server_url, stack.served_name, concurrency=CONCURRENCY,
                                    requests=CONCURRENCY, max_tokens=8))
        assert not warm.failures, warm.failures[:2]
        time.sleep(6.0)  # the warm-up's spans leave (5 s export delay) before the count starts
        spans_before = sink.spans
        load = asyncio.run(run_load(stack.server_url, stack.served_name, concurrency=CONCURRENCY,
                                    duration_s=duration_s, max_tokens=MAX_TOKENS))
        time.sleep(6.0)  # past the span export delay (5 s by default in both), so the spans are counted
        gaps = sorted(load.gaps())
        return {
            "requests": len(load.results), "failures": len(load.failures), "tokens": load.tokens,
            "wall_s": load.wall_s, "throughput_tok_s": load.throughput, "itl_mean_ms": load.mean_itl_ms(),
            "itl_p50_ms": gaps[len(gaps) // 2] * 1e3 if gaps else 0.0,
            "itl_p99_ms": gaps[int(len(gaps) * 0.99)] * 1e3 if gaps else 0.0,
            "ttft_mean_ms": statistics.fmean(r.ttft_s for r in load.results if r.ok) * 1e3,
            "spans_exported": sink.spans - spans_before,
        }
    finally:
        stack.close()


def _load_bench_hooks():
    spec = importlib.util.spec_from_file_location("bench_hooks", Path(__file__).with_name("bench_hooks.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def step_hook_cost() -> dict:
    """ns per worker step (execute_model + sample_tokens) with the probe alone and with the step recorder."""
    from opentelemetry.sdk.metrics import MeterProvider

    from sidecar.probe import Probe
    from sidecar.telemetry.instruments import StepInstruments
    from sidecar.telemetry.steps import StepRecorder
    from sidecar.integration import patching
    from sidecar_vllm import hooks
    from sidecar_vllm.profile import VLLM_PROFILE

    bench = _load_bench_hooks()
    plain_cls, _ = bench.make_classes()
    hooked_cls, _ = bench.make_classes()
    patching.patch(hooked_cls, "execute_model", hooks._wrap_execute_model)
    patching.patch(hooked_cls, "sample_tokens", hooks._wrap_sample_tokens)
    probe = Probe("worker", 0, profile=VLLM_PROFILE, endpoint="http://127.0.0.1:9", cuda_available=False)  # idle
    recorder = StepRecorder(StepInstruments(MeterProvider().get_meter("bench")), role="worker")
    plain, probe_only, with_steps = plain_cls(), hooked_cls(), hooked_cls()
    probe_only.__dict__[hooks.PROBE_ATTR] = probe
    with_steps.__dict__[hooks.PROBE_ATTR] = probe
    with_steps.__dict__[hooks.STEPS_ATTR] = recorder
    so = bench.SchedulerOutput()
    so.num_scheduled_tokens = {f"r{i}": 1 for i in range(8)}

    def step(obj):
        def run():
            obj.execute_model(so)
            obj.sample_tokens(None)
            if len(recorder._buffer) > 50_000:  # what the drain thread does, outside the timed region's share
                recorder._buffer.clear()
        return run

    out = {"worker_step_plain_ns": bench.per_call_ns(step(plain)),
           "worker_step_probe_ns": bench.per_call_ns(step(probe_only)),
           "worker_step_probe_and_steps_ns": bench.per_call_ns(step(with_steps))}
    out["step_recorder_added_ns"] = out["worker_step_probe_and_steps_ns"] - out["worker_step_probe_ns"]
    out["hooks_added_ns"] = out["worker_step_probe_and_steps_ns"] - out["worker_step_plain_ns"]
    out["hooks_share_of_1ms_step"] = out["hooks_added_ns"] / 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "126m")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load per configuration")
    parser.add_argument("--rounds", type=int, default=2, help="repeat the three configurations, order alternating")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-results" / "telemetry-work")
    args = parser.parse_args(argv)

    micro = step_hook_cost()
    print(f"worker step hooks: {micro['worker_step_plain_ns']:.0f} ns plain, {micro['worker_step_probe_ns']:.0f} ns "
          f"probe, {micro['worker_step_probe_and_steps_ns']:.0f} ns probe + step recorder "
          f"({micro['step_recorder_added_ns']:.0f} ns for the recorder; hooks = "
          f"{micro['hooks_share_of_1ms_step'] * 100:.3f} % of a 1 ms step)", flush=True)

    if not (args.model / "config.json").exists():
        from sidecar.cli.make_model import build_model

        print(f"building the 126M model in {args.model}", flush=True)
        build_model(args.model, size="126m")
    sink = OtlpSink()
    runs: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for config in (CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))):
            result = run_config(config, args.model, args.work / f"round{r}", sink, args.duration)
            runs[config].append(result)
            print(f"  {config:13s} round {r}: {result['throughput_tok_s']:7.1f} tok/s, ITL mean "
                  f"{result['itl_mean_ms']:.2f} ms (p99 {result['itl_p99_ms']:.2f}), {result['requests']} requests, "
                  f"{result['failures']} failed, {result['spans_exported']} spans exported", flush=True)
            if result["failures"]:
                print(f"{config}: requests failed", file=sys.stderr)
                return 1

    def mean(config: str, key: str) -> float:
        return statistics.fmean(run[key] for run in runs[config])

    summary = {c: {k: mean(c, k) for k in ("throughput_tok_s", "itl_mean_ms", "itl_p99_ms", "ttft_mean_ms")}
               for c in CONFIGS}
    off = summary["off"]
    ratios = {c: {"throughput_vs_off": summary[c]["throughput_tok_s"] / off["throughput_tok_s"],
                  "itl_vs_off": summary[c]["itl_mean_ms"] / off["itl_mean_ms"]} for c in CONFIGS if c != "off"}
    checks = {
        "sidecar_spans_exported": all(run["spans_exported"] > 0 for run in runs["sidecar"]),
        "vllm_spans_exported": all(run["spans_exported"] > 0 for run in runs["vllm_tracing"]),
        "sidecar_within_1pct_of_off": ratios["sidecar"]["throughput_vs_off"] >= 0.99
        and ratios["sidecar"]["itl_vs_off"] <= 1.01,
        "sidecar_cheaper_than_vllm_tracing": summary["sidecar"]["throughput_tok_s"]
        >= summary["vllm_tracing"]["throughput_tok_s"],
    }
    results = {"model": str(args.model), "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS,
               "duration_s": args.duration, "rounds": args.rounds, "step_hooks": micro, "runs": runs,
               "summary": summary, "ratios": ratios, "checks": checks}
    out = ROOT / "bench-results" / "telemetry.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print("telemetry cost, 8 streaming clients (mean over rounds)")
    for c in CONFIGS:
        line = f"  {c:13s} {summary[c]['throughput_tok_s']:7.1f} tok/s, ITL {summary[c]['itl_mean_ms']:.2f} ms"
        if c in ratios:
            line += (f"  (throughput x{ratios[c]['throughput_vs_off']:.4f}, ITL x{ratios[c]['itl_vs_off']:.4f} "
                     f"vs off)")
        print(line)
    print(f"  checks: {checks}")
    # Spans must really have been exported; the cost targets are reported, judged on a quiet machine.
    return 0 if checks["sidecar_spans_exported"] and checks["vllm_spans_exported"] else 1


if __name__ == "__main__":
    sys.exit(main())
