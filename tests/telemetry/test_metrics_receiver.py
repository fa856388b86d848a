"""The sidecar's /v1/metrics + /metrics, fed by the real OpenTelemetry SDK over real HTTP."""

import asyncio
import hashlib
import hmac
import json
import logging
import math
import time

from aiohttp import web
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.service.routes.metrics import CAPTURE_METRICS, METRICS_STORE, add_metrics_routes
from sidecar.telemetry.instruments import RequestInstruments, StepInstruments
from sidecar.telemetry.push import SidecarMetricExporter

TOKEN = "s3cret"
PROCESS_LABELS = {"service_name", "service_instance_id", "process_pid", "sidecar_process_role", "sidecar_process_rank"}


def _app(**kwargs) -> web.Application:
    app = web.Application()
    add_metrics_routes(app, **kwargs)
    return app


def _provider(role: str, pid: int, *readers) -> MeterProvider:
    resource = Resource({"service.name": "vllm", "service.instance.id": f"id-{pid}", "process.pid": pid,
                         "sidecar.process.role": role})
    return MeterProvider(resource=resource, metric_readers=list(readers))


def _record(provider: MeterProvider) -> None:
    meter = provider.get_meter("inference-sidecar", "0.1.0")
    requests, steps = RequestInstruments(meter), StepInstruments(meter)
    attrs = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm", "gen_ai.request.model": "tiny"}
    for ttft in (0.003, 0.03, 0.3):
        requests.time_to_first_token.record(ttft, attrs)
        requests.duration.record(ttft * 10, attrs)
        requests.requests.add(1, attrs)
    requests.requests.add(1, {**attrs, "error.type": "aborted"})
    requests.tokens.add(7, {**attrs, "gen_ai.token.type": "output"})
    steps.duration.record(0.0012, {"sidecar.process.role": "worker"})
    steps.batch_size.record(3, {"sidecar.process.role": "worker"})
    meter.create_gauge("process.memory.usage", unit="By").set(1234)


async def _shutdown(provider: MeterProvider) -> None:
    # Shutting down pushes once more, synchronously: off the loop, or the server could not answer.
    await asyncio.get_running_loop().run_in_executor(None, provider.shutdown)


def _samples(text: str) -> dict:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


async def _push(server_url: str, provider: MeterProvider, exporter_reader) -> None:
    # The exporter is synchronous (urllib, as on the engine's reader thread): run it off the loop.
    await asyncio.get_running_loop().run_in_executor(None, exporter_reader.force_flush)


async def test_names_match_the_opentelemetry_prometheus_exporter(aiohttp_client):
    client = await aiohttp_client(_app(push_token=TOKEN))
    url = str(client.make_url("/v1/metrics"))
    exporter = SidecarMetricExporter(url, token_provider=lambda: TOKEN)
    push_reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    reference_registry = CollectorRegistry()
    reference = PrometheusMetricReader(registry=reference_registry)
    provider = _provider("api_server", 101, push_reader, reference)
    _record(provider)
    await _push(url, provider, push_reader)
    assert exporter.pushes == 1 and exporter.failures == 0

    ours = _samples(await (await client.get("/metrics")).text())
    theirs = _samples(generate_latest(reference_registry).decode())
    assert "gen_ai_server_time_to_first_token_seconds_bucket" in ours
    assert "sidecar_requests_total" in ours and "process_memory_usage_bytes" in ours
    for name, their_rows in theirs.items():
        if name == "target_info":
            continue
        assert name in ours, name
        def key(labels):  # the exporter does not add the process labels; le "1" vs "1.0" is one number
            labels = {k: v for k, v in labels.items() if k not in PROCESS_LABELS}
            if "le" in labels:
                labels["le"] = str(float(labels["le"]))
            return tuple(sorted(labels.items()))
        their = {key(labels): value for labels, value in their_rows}
        mine = {key(labels): value for labels, value in ours[name]}
        assert mine.keys() == their.keys(), name
        for k, value in their.items():
            assert math.isclose(mine[k], value), (name, k)
    for labels, _ in ours["gen_ai_server_time_to_first_token_seconds_count"]:
        assert labels["sidecar_process_role"] == "api_server" and labels["process_pid"] == "101"
    await _shutdown(provider)


async def test_one_target_for_all_processes(aiohttp_client):
    client = await aiohttp_client(_app())
    url = str(client.make_url("/v1/metrics"))
    providers = []
    for role, pid in (("api_server", 1), ("engine_core", 2), ("worker", 3)):
        reader = PeriodicExportingMetricReader(SidecarMetricExporter(url, token_provider=lambda: None),
                                               export_interval_millis=3_600_000)
        provider = _provider(role, pid, reader)
        _record(provider)
        await _push(url, provider, reader)
        providers.append(provider)
    samples = _samples(await (await client.get("/metrics")).text())
    counts = samples["gen_ai_server_time_to_first_token_seconds_count"]
    assert sorted(labels["sidecar_process_role"] for labels, _ in counts) == ["api_server", "engine_core", "worker"]
    assert sum(v for _, v in counts) == 9
    assert len(samples["target_info"]) == 3
    assert client.app[METRICS_STORE].processes() == 3
    for provider in providers:
        await _shutdown(provider)


def _signed(body: bytes, timestamp: int | None = None, token: str = TOKEN) -> dict:
    """The headers of a signed push, spelled out as docs/api.md gives them."""
    ts = str(int(time.time()) if timestamp is None else timestamp)
    digest = hashlib.sha256(body).hexdigest()
    signature = hmac.new(token.encode(), b"metrics\0" + ts.encode() + b"\0" + digest.encode(), hashlib.sha256).hexdigest()
    return {"X-Sidecar-Timestamp": ts, "X-Sidecar-Signature": signature, "Content-Type": "application/x-protobuf"}


async def test_push_needs_a_valid_signature_and_protobuf(aiohttp_client):
    client = await aiohttp_client(_app(push_token=TOKEN))
    body = ExportMetricsServiceRequest().SerializeToString()

    async def refused(headers, data=body):
        resp = await client.post("/v1/metrics", data=data, headers=headers)
        assert resp.status == 401, headers
        assert set(await resp.json()) == {"error", "message"} and (await resp.json())["error"] == "unauthorized"

    await refused({"Content-Type": "application/x-protobuf"})  # unsigned
    await refused({"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"})  # the token is no key
    await refused({**_signed(body), "X-Sidecar-Signature": "0" * 64})  # forged
    await refused(_signed(body, token="guess"))  # signed with another token
    await refused(_signed(body, timestamp=int(time.time()) - 120))  # stale
    await refused(_signed(body, timestamp=int(time.time()) + 120))  # from the future
    await refused({**_signed(body), "X-Sidecar-Timestamp": "soon"})
    other = ExportMetricsServiceRequest(resource_metrics=[{}]).SerializeToString()
    await refused(_signed(body), data=other)  # a signature seen on the wire, on another body

    headers = _signed(body)
    assert (await client.post("/v1/metrics", data=body, headers=headers)).status == 200
    await refused(headers)  # the same push again: a replay
    assert (await client.post("/v1/metrics", json={}, headers={**_signed(b"{}"), "Content-Type": "application/json"})
            ).status == 415
    bad = await client.post("/v1/metrics", data=b"\xff\xff\xff", headers=_signed(b"\xff\xff\xff"))
    assert bad.status == 400


async def test_the_exporter_signs_each_push_and_sends_no_token(aiohttp_client):
    seen = []

    @web.middleware
    async def keep_headers(request, handler):
        seen.append(dict(request.headers))
        return await handler(request)

    app = web.Application(middlewares=[keep_headers])
    add_metrics_routes(app, push_token=TOKEN)
    client = await aiohttp_client(app)
    url = str(client.make_url("/v1/metrics"))
    exporter = SidecarMetricExporter(url, token_provider=lambda: TOKEN)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = _provider("worker", 11, reader)
    _record(provider)
    await _push(url, provider, reader)
    assert exporter.pushes == 1 and exporter.failures == 0
    [headers] = seen
    assert "Authorization" not in headers and TOKEN not in json.dumps(headers)
    assert abs(int(headers["X-Sidecar-Timestamp"]) - time.time()) < 5 and len(headers["X-Sidecar-Signature"]) == 64
    await _shutdown(provider)


async def test_stale_processes_disappear_and_capture_counters_render(aiohttp_client):
    # Stale after a minute, then after 50 ms: a loaded host once took longer than a 0.2 s limit
    # between the push and the first scrape.
    client = await aiohttp_client(_app(stale_after_s=60))
    url = str(client.make_url("/v1/metrics"))
    reader = PeriodicExportingMetricReader(SidecarMetricExporter(url, token_provider=lambda: None),
                                           export_interval_millis=3_600_000)
    provider = _provider("worker", 9, reader)
    _record(provider)
    await _push(url, provider, reader)
    client.app[CAPTURE_METRICS].observe("done", steps=5, nbytes=1000, duration_s=1.5)
    assert "sidecar_step_duration_seconds_bucket" in _samples(await (await client.get("/metrics")).text())
    client.app[METRICS_STORE].stale_after_s = 0.05
    await asyncio.sleep(0.1)
    samples = _samples(await (await client.get("/metrics")).text())
    assert "sidecar_step_duration_seconds_bucket" not in samples
    assert samples["sidecar_captures_total"] == [({"state": "done"}, 1.0)]
    assert samples["sidecar_capture_bytes_total"][0][1] == 1000
    await _shutdown(provider)


def test_unreachable_sidecar_is_a_failed_push_not_an_error(caplog):
    exporter = SidecarMetricExporter("http://127.0.0.1:9/v1/metrics", token_provider=lambda: None)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
    provider = _provider("worker", 10, reader)
    _record(provider)
    with caplog.at_level(logging.INFO, logger="sidecar.telemetry.push"):
        reader.force_flush()
        reader.force_flush()
    assert exporter.failures == 2 and exporter.pushes == 0
    assert caplog.text.count("cannot push metrics") == 1
    provider.shutdown()
