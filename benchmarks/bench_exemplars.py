"""What exemplars cost on the request path: ``record_request`` with exemplars on against off.

One finished request's telemetry (its span tree and metrics, as the vLLM stat logger records it when
the request ends, on the API server's event loop) through two ``Telemetry`` objects that differ only in
``OTEL_METRICS_EXEMPLAR_FILTER``: ``trace_based`` (the default: the four request histograms recorded in
the request span's context, each with the request id that the SDK's Views move into the exemplar) and
``always_off`` (the request histograms recorded as before exemplars existed). Spans go to an exporter
that drops them, on the span processor's own thread; metrics to a reader that is never collected.

Also timed, on vs off: the step drain (the sampler thread turning buffered worker steps into histogram
records). The step path itself (``StepRecorder.observe``: two clock reads and a deque append) records
no histogram and is not touched by exemplars; the drain runs in no span, so the trace-based filter
keeps nothing there (it already was the SDK's default filter before this change).

Every figure is the calling thread's CPU time (``time.thread_time``) per call, the 10th percentile of
many short batches, the variants interleaved round after round in alternating order (as
bench_hooks.py, which says why). Results: bench-results/exemplars.json.

python benchmarks/bench_exemplars.py [--rounds 41] [--number 200] [--quantile 0.1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402

from sidecar.telemetry import ClockOffset, FinishedRequest, Telemetry, TelemetrySettings, record_request  # noqa: E402
from sidecar.telemetry.settings import EXEMPLARS_ALWAYS_OFF, EXEMPLARS_TRACE_BASED  # noqa: E402

FILTERS = {"on": EXEMPLARS_TRACE_BASED, "off": EXEMPLARS_ALWAYS_OFF}
STEPS_PER_DRAIN = 20


class DropSpans(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


def telemetry(exemplar_filter: str) -> Telemetry:
    return Telemetry(TelemetrySettings(exemplar_filter=exemplar_filter, span_schedule_delay_ms=50),
                     Resource({"service.name": "bench", "sidecar.process.role": "api_server"}),
                     span_exporter=DropSpans(), metric_readers=[InMemoryMetricReader()])


def requests(clock: ClockOffset, n: int = 1000) -> list[FinishedRequest]:
    """Finished streaming chat requests as vLLM's stat logger makes them: queue, prefill, 64 tokens."""
    arrival = time.time() - 2.0
    mono = arrival - clock.wall_minus_monotonic
    return [FinishedRequest(
        request_id=f"chatcmpl-{i:032x}", model="Qwen/Qwen2.5-0.5B-Instruct", operation="chat", finish_reason="length",
        arrival_time=arrival, finished_time=arrival + 0.7 + i % 7 * 0.01, queued_ts=mono + 0.002,
        scheduled_ts=mono + 0.004 + i % 5 * 0.003, first_token_ts=mono + 0.03 + i % 11 * 0.004, last_token_ts=mono + 0.69,
        time_to_first_token=0.032 + i % 11 * 0.004, input_tokens=120, output_tokens=64, max_tokens=64, temperature=0.7)
        for i in range(n)]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    lo = int(at)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41, help="interleaved rounds of every variant")
    parser.add_argument("--number", type=int, default=200, help="calls per variant and round (one batch)")
    parser.add_argument("--quantile", type=float, default=0.1, help="a variant's figure: this quantile of its batches")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "exemplars.json")
    args = parser.parse_args(argv)
    if args.rounds < 2 or args.number < 1 or not 0 <= args.quantile <= 1:
        parser.error("--rounds must be at least 2, --number at least 1, --quantile within 0..1")
    clock = ClockOffset.measure()
    finished = requests(clock)
    variants, owned = {}, []
    for label, exemplar_filter in FILTERS.items():
        tel = telemetry(exemplar_filter)
        owned.append(tel)
        recorder = tel.step_recorder("worker")
        def one_request(tel=tel, cursor=iter(range(1 << 62))):
            record_request(finished[next(cursor) % len(finished)], tel.tracer, tel.requests, clock)

        def drain(recorder=recorder):
            # What the sampler thread does once a second, for STEPS_PER_DRAIN buffered steps.
            now = time.time_ns()
            for i in range(STEPS_PER_DRAIN):
                recorder.observe(now, now + 1_000_000, 8, 8 + i % 3)
            recorder.drain()

        variants[f"record_request_{label}_ns"] = (one_request, 1)
        variants[f"step_drain_{label}_ns"] = (drain, STEPS_PER_DRAIN)
    assert owned[0].requests.exemplars and not owned[1].requests.exemplars

    def per_call_ns(name: str) -> float:
        fn, per = variants[name]
        return timeit.Timer(fn, timer=time.thread_time).timeit(args.number) / args.number / per * 1e9

    names = list(variants)
    for name in names:  # warm every path before timing
        per_call_ns(name)
    rounds = []
    for r in range(args.rounds):
        order = names if r % 2 == 0 else names[::-1]
        rounds.append({name: per_call_ns(name) for name in order})
    for tel in owned:
        tel.shutdown()
    results: dict = {name: round(quantile([r[name] for r in rounds], args.quantile), 1) for name in names}
    for what in ("record_request", "step_drain"):
        on, off = results[f"{what}_on_ns"], results[f"{what}_off_ns"]
        paired = [r[f"{what}_on_ns"] / r[f"{what}_off_ns"] for r in rounds]
        results[f"{what}_ratio_on_off"] = round(on / off, 4)
        results[f"{what}_added_ns"] = round(on - off, 1)
        results[f"{what}_paired_ratio_quartiles"] = [round(quantile(paired, q), 4) for q in (0.25, 0.5, 0.75)]
    results.update(timer="thread_time", rounds=args.rounds, number=args.number, quantile=args.quantile)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"exemplars on (trace_based) vs off (always_off); thread CPU time, quantile {args.quantile} of "
          f"{args.rounds} interleaved batches of {args.number} calls")
    print(f"  record_request (span tree + metrics of one request): {results['record_request_on_ns'] / 1000:.1f} µs on, "
          f"{results['record_request_off_ns'] / 1000:.1f} µs off: ratio {results['record_request_ratio_on_off']:.3f} "
          f"(+{results['record_request_added_ns'] / 1000:.1f} µs per request; per-round ratios, quartiles "
          f"{' / '.join(f'{q:.3f}' for q in results['record_request_paired_ratio_quartiles'])})")
    print(f"  step drain (sampler thread, per step): {results['step_drain_on_ns']:.0f} ns on, "
          f"{results['step_drain_off_ns']:.0f} ns off: ratio {results['step_drain_ratio_on_off']:.3f}; "
          f"the step path itself records no histogram")
    return 0


if __name__ == "__main__":
    sys.exit(main())
