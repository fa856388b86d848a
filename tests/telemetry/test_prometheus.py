"""A real Prometheus scrapes the sidecar's /metrics while real telemetry pushes to it; every query in
dashboards/ (panels and annotations) is run against it."""

import asyncio
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import aiohttp
from aiohttp import web
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from prometheus_client import Counter

from sidecar.service.metrics.engine_state import EngineStateCollector
from sidecar.service.routes.metrics import CAPTURE_METRICS, METRICS_REGISTRY, add_metrics_routes
from sidecar.telemetry import ClockOffset, FinishedRequest, Telemetry, TelemetrySettings, make_resource, record_request

ROOT = Path(__file__).resolve().parents[2]
GPU_METRICS = ("hw_gpu_", "hw_power_", "hw_temperature_")  # NVML: empty where the host has no NVIDIA driver
REQUESTS = 7


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(clock: ClockOffset, i: int, aborted: bool = False) -> FinishedRequest:
    arrival = time.time() - 1.0
    mono = arrival - clock.wall_minus_monotonic
    return FinishedRequest(
        request_id=f"chatcmpl-{i}", model="tiny", operation="chat", finish_reason="abort" if aborted else "stop",
        arrival_time=arrival, finished_time=arrival + 0.2 + i * 0.01, queued_ts=mono + 0.001,
        scheduled_ts=mono + 0.004 + i * 0.001, first_token_ts=mono + 0.02, last_token_ts=mono + 0.19,
        time_to_first_token=0.021, input_tokens=20, output_tokens=0 if aborted else 16)


def _dashboard_queries() -> list[str]:
    dashboard = json.loads((ROOT / "dashboards/inference-sidecar.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _dashboard_annotations() -> dict[str, str]:
    dashboard = json.loads((ROOT / "dashboards/inference-sidecar.json").read_text())
    return {a["name"]: a["expr"] for a in dashboard["annotations"]["list"] if "expr" in a}


def _engine_state(probes: list) -> EngineStateCollector:
    """The sidecar's engine-state gauges over stand-ins for probe connections (what their heartbeats set)."""
    return EngineStateCollector(SimpleNamespace(all=lambda: probes))


def _probe(role: str, pid: int, step_driven: bool, **state) -> SimpleNamespace:
    identity = SimpleNamespace(label=f"{role} (pid {pid})", role=role, pid=pid, step_driven=step_driven)
    return SimpleNamespace(identity=identity, **{"stuck": None, "open_step_ms": None, "in_flight": None, **state})


async def _query(session: aiohttp.ClientSession, base: str, expr: str) -> list:
    async with session.get(f"{base}/api/v1/query", params={"query": expr}) as response:
        body = await response.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


async def _query_range(session: aiohttp.ClientSession, base: str, expr: str, start: float) -> list:
    """As Grafana runs an annotation query: over a time range, at a step."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{time.time():.3f}", "step": "1s"}
    async with session.get(f"{base}/api/v1/query_range", params=params) as response:
        body = await response.json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


async def test_prometheus_scrapes_every_process_and_dashboard_queries_return_data(tmp_path):
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus not installed: run scripts/install-test-backends.sh"
    app = web.Application()
    add_metrics_routes(app)
    # The gauges the probes' heartbeats feed: an engine core holding two requests (the oldest 3 s old) and a
    # worker whose step has run 250 ms and that its watchdog reports stuck.
    in_flight = SimpleNamespace(count=2, oldest_arrival_ns=time.time_ns() - 3_000_000_000)
    app[METRICS_REGISTRY].register(_engine_state([
        _probe("engine_core", 11, False, in_flight=in_flight),
        _probe("worker", 12, True, open_step_ms=250.0, stuck={"step": 5, "age_s": 61.0})]))
    # The trigger firings counter as the sidecar's Triggers keeps it (each trigger's outcomes from 0).
    firings = Counter("sidecar_trigger_firings", "Trigger firings, by trigger and outcome (fired, skipped).",
                      ["trigger", "outcome"], registry=app[METRICS_REGISTRY])
    for outcome in ("fired", "skipped"):
        firings.labels(trigger="trg-0001", outcome=outcome)
    # A scan's findings (sync_findings.SyncFindings) and the always-on watch's calls (its WatchCollector), as the
    # sidecar exports them, with one hidden site each.
    Counter("sidecar_sync_site_hits", "Sync scan findings.", ["classification", "op", "phase", "site"],
            registry=app[METRICS_REGISTRY]).labels(classification="hidden", op="item", phase="forward",
                                                    site="model.py:42").inc(3)
    Counter("sidecar_sync_watch_calls", "Sync watch calls.", ["process", "classification", "op", "phase", "site"],
            registry=app[METRICS_REGISTRY]).labels(process="worker (pid 12)", classification="hidden", op="cuda_sync",
                                                    phase="forward", site="model.py:88").inc(5)
    runner = web.AppRunner(app)
    await runner.setup()
    sidecar_port, prom_port = _free_port(), _free_port()
    await web.TCPSite(runner, "127.0.0.1", sidecar_port).start()

    settings = TelemetrySettings(sidecar_metrics_url=f"http://127.0.0.1:{sidecar_port}/v1/metrics",
                                 metrics_push_interval_ms=300, sample_interval_s=0.3, span_schedule_delay_ms=50,
                                 span_queue_size=4, span_batch_size=4)
    # Spans go to a real OTLP exporter whose backend is down: they are dropped and counted.
    api = Telemetry(settings, make_resource("api_server"),
                    span_exporter=OTLPSpanExporter(endpoint="http://127.0.0.1:9/v1/traces", timeout=0.5))
    api.start_samplers(process=True, gpu=True)
    worker = Telemetry(settings, make_resource("worker", 0)).start_samplers(process=True)
    steps = worker.step_recorder("worker")

    def traffic(first: int, count: int) -> None:
        clock = ClockOffset.measure()
        for i in range(first, first + count):
            record_request(_request(clock, i, aborted=(i == 0)), api.tracer, api.requests, clock)
            now = time.time_ns()
            steps.observe(now - 2_000_000, now, batch_size=2, tokens=2)

    config = tmp_path / "prometheus.yml"
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: sidecar\n"
                      f"    static_configs:\n      - targets: ['127.0.0.1:{sidecar_port}']\n")
    proc = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{prom_port}"
    started = time.time()
    try:
        traffic(0, 3)
        app[CAPTURE_METRICS].observe("done", steps=10, nbytes=4096, duration_s=0.8)
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 60
            async def wait_for(expr: str, value: float) -> None:
                while True:
                    try:
                        result = await _query(session, base, expr)
                        if result and float(result[0]["value"][1]) == value:
                            return
                    except aiohttp.ClientError:
                        pass
                    assert time.monotonic() < deadline, f"{expr} never reached {value}"
                    await asyncio.sleep(0.3)

            await wait_for("sum(gen_ai_server_request_duration_seconds_count)", 3)
            await asyncio.sleep(2.5)  # a few scrapes with the first values, so rates have two points
            await asyncio.get_running_loop().run_in_executor(None, traffic, 3, REQUESTS - 3)
            app[CAPTURE_METRICS].observe("failed", steps=0, nbytes=0, duration_s=0.1)
            firings.labels(trigger="trg-0001", outcome="fired").inc()
            firings.labels(trigger="trg-0001", outcome="skipped").inc()
            # Histogram counts equal the number of requests (the aborted one has no TTFT, by the conventions).
            await wait_for("sum(gen_ai_server_request_duration_seconds_count)", REQUESTS)
            await wait_for("sum(gen_ai_server_time_to_first_token_seconds_count)", REQUESTS - 1)
            await wait_for("sum(sidecar_requests_total)", REQUESTS)
            await wait_for("sum(sidecar_step_duration_seconds_count)", REQUESTS)
            await wait_for('count(count by (sidecar_process_role) (process_memory_usage_bytes))', 2)
            await wait_for('sum(sidecar_trigger_firings_total{outcome="fired"})', 1)
            await wait_for('sum(sidecar_captures_total{state="failed"})', 1)
            while not await _query(session, base, "sum(sidecar_telemetry_spans_dropped_total) > 0"):
                assert time.monotonic() < deadline, "dropped spans were never counted"
                await asyncio.sleep(0.3)
            await asyncio.sleep(2.0)

            empty = []
            for expr in _dashboard_queries():
                result = await _query(session, base, expr.replace("$__rate_interval", "1m"))
                if not result:
                    empty.append(expr)
            # Without an NVIDIA driver the GPU panels have nothing to show; with one, every panel has data.
            excused = [e for e in empty if any(m in e for m in GPU_METRICS)] if not api.samples_gpus else []
            assert empty == excused, f"dashboard queries without data: {sorted(set(empty) - set(excused))}"

            # The incident panels read what the heartbeats said.
            assert float((await _query(session, base, "sum(sidecar_requests_in_flight)"))[0]["value"][1]) == 2
            assert float((await _query(session, base, "max(sidecar_request_oldest_age_seconds)"))[0]["value"][1]) >= 3
            stuck = await _query(session, base, "max by (process) (sidecar_engine_step_stuck)")
            assert [(r["metric"]["process"], r["value"][1]) for r in stuck] == [("worker (pid 12)", "1")]

            # Annotations, run as Grafana runs them (a range query): one capture state that appeared while
            # Prometheus watched (failed), one there from its first scrape (done), and the trigger's firing.
            annotations = _dashboard_annotations()
            assert set(annotations) == {"Captures", "Trigger firings"}
            captures = await _query_range(session, base, annotations["Captures"], started)
            assert {r["metric"]["state"] for r in captures} == {"done", "failed"}
            assert all(float(v) > 0 for r in captures for _, v in r["values"])  # Grafana marks values > 0
            fired = await _query_range(session, base, annotations["Trigger firings"], started)
            assert [r["metric"] for r in fired] == [{"trigger": "trg-0001"}]
    finally:
        proc.terminate()
        proc.wait(10)
        await asyncio.get_running_loop().run_in_executor(None, api.shutdown)
        await asyncio.get_running_loop().run_in_executor(None, worker.shutdown)
        await runner.cleanup()
