"""Issue 30, item 1: exemplars. The request histograms are recorded in their request span's context
with the SDK's trace-based exemplar filter, each exemplar naming its request; the push carries them;
/metrics shows them in OpenMetrics when the scraper asks for it, and the text format stays the default.
A real Prometheus with exemplar storage returns them (here with the SDK in this process; beside real
vLLM and Phoenix in test_vllm_live.py)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from aiohttp import web
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Exemplar
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from sidecar.service.metrics.otlp_translation import (
    EXEMPLAR_MAX_CHARS,
    SPAN_ID_LABEL,
    TRACE_ID_LABEL,
    metric_name,
    unit_suffix,
)
from sidecar.service.routes.metrics import CAPTURE_METRICS, METRICS_REGISTRY, METRICS_STORE, add_metrics_routes
from sidecar.telemetry import ClockOffset, Telemetry, TelemetrySettings, record_request
from sidecar.telemetry.instruments import (
    EXEMPLAR_REQUEST_ID,
    GEN_AI_SERVER_REQUEST_DURATION,
    GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
    REQUEST_HISTOGRAMS,
    REQUESTS,
    STEP_DURATION,
    TOKENS,
)
from sidecar.telemetry.push import SidecarMetricExporter
from sidecar.telemetry.settings import DEFAULT_EXEMPLAR_FILTER, OTEL_METRICS_EXEMPLAR_FILTER

from .e2e import Prometheus, _free_port
from .helpers import in_memory_telemetry
from .metric_pushes import TOKEN, app, histogram, push, request
from .test_requests import TRACE_ID, _request

ROOT = Path(__file__).resolve().parents[2]
OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
# What Prometheus 2.42 sends with every scrape (scrape/scrape.go, scrapeAcceptHeader).
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
TTFT_BUCKETS = "gen_ai_server_time_to_first_token_seconds_bucket"


def _points(data, name: str) -> list:
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name
            for p in m.data.data_points]


def _root(exporter: InMemorySpanExporter):
    [root] = [s for s in exporter.get_finished_spans() if s.parent is None or s.parent.is_remote]
    return root


# -- the engine's side: the SDK ----------------------------------------------------------------------------

def test_request_histograms_carry_the_request_spans_ids_and_its_request_id():
    telemetry, exporter, reader = in_memory_telemetry()
    clock = ClockOffset.measure()
    returned = record_request(_request(clock), telemetry.tracer, telemetry.requests, clock)
    telemetry.span_processor.force_flush()
    root = _root(exporter).context
    assert (returned.trace_id, returned.span_id) == (root.trace_id, root.span_id)
    data = reader.get_metrics_data()  # one collection: each one hands the exemplars over once
    for name in REQUEST_HISTOGRAMS:
        [point] = _points(data, name)
        # The request id is in the exemplar only: never a label of the series.
        assert set(point.attributes) == {"gen_ai.operation.name", "gen_ai.request.model"}, name
        [exemplar] = point.exemplars
        assert (exemplar.trace_id, exemplar.span_id) == (root.trace_id, root.span_id), name
        assert exemplar.filtered_attributes == {EXEMPLAR_REQUEST_ID: "chatcmpl-abc"}, name
        assert exemplar.value == point.sum, name
    # Counters are recorded outside the span: no exemplars there.
    for name in (REQUESTS, TOKENS):
        assert all(not p.exemplars for p in _points(data, name)), name


def test_a_request_id_never_becomes_a_series():
    telemetry, _, reader = in_memory_telemetry()
    clock = ClockOffset.measure()
    for i in range(20):
        record_request(_request(clock, request_id=f"chatcmpl-{i}"), telemetry.tracer, telemetry.requests, clock)
    record_request(_request(clock, request_id="chatcmpl-x", finish_reason="abort"), telemetry.tracer,
                   telemetry.requests, clock)
    data = reader.get_metrics_data()
    assert len(_points(data, GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)) == 1
    durations = _points(data, GEN_AI_SERVER_REQUEST_DURATION)
    assert sorted(p.attributes.get("error.type", "") for p in durations) == ["", "aborted"]
    assert sum(p.count for p in durations) == 21
    # The aggregated exemplar per bucket is the last request's of that bucket.
    [ttft] = _points(data, GEN_AI_SERVER_TIME_TO_FIRST_TOKEN)
    assert [e.filtered_attributes[EXEMPLAR_REQUEST_ID] for e in ttft.exemplars] == ["chatcmpl-19"]


def test_no_exemplar_when_the_request_span_is_not_sampled():
    telemetry, exporter, reader = in_memory_telemetry()
    clock = ClockOffset.measure()
    unsampled = {"traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-00"}  # the caller did not sample this trace
    record_request(_request(clock, trace_headers=unsampled), telemetry.tracer, telemetry.requests, clock)
    telemetry.span_processor.force_flush()
    assert exporter.get_finished_spans() == ()
    data = reader.get_metrics_data()
    for name in REQUEST_HISTOGRAMS:
        [point] = _points(data, name)
        assert point.count == 1 and not point.exemplars, name


def test_no_exemplar_without_span_export():
    reader = InMemoryMetricReader()
    telemetry = Telemetry(TelemetrySettings(), Resource({"service.name": "test"}), metric_readers=[reader])
    assert not telemetry.traces_on
    clock = ClockOffset.measure()
    record_request(_request(clock), telemetry.tracer, telemetry.requests, clock)
    data = reader.get_metrics_data()
    assert all(not p.exemplars for name in REQUEST_HISTOGRAMS for p in _points(data, name))
    telemetry.shutdown()


def test_always_off_records_the_series_of_before_and_no_exemplar():
    telemetry, _, reader = in_memory_telemetry(exemplar_filter="always_off")
    assert not telemetry.requests.exemplars
    clock = ClockOffset.measure()
    record_request(_request(clock), telemetry.tracer, telemetry.requests, clock)
    data = reader.get_metrics_data()
    for name in REQUEST_HISTOGRAMS:
        [point] = _points(data, name)
        assert set(point.attributes) == {"gen_ai.operation.name", "gen_ai.request.model"} and not point.exemplars


def test_step_histograms_have_no_exemplars():
    """The step path never touches the request histograms, and the step drain runs in no span."""
    telemetry, _, reader = in_memory_telemetry()
    now = time.time_ns()
    telemetry.step_recorder("worker").observe(now, now + 1_000_000, batch_size=2, tokens=9)
    telemetry.run_tasks_once()
    [point] = _points(reader.get_metrics_data(), STEP_DURATION)
    assert point.count == 1 and not point.exemplars


@pytest.mark.parametrize("value, expected", [("", "trace_based"), ("always_on", "always_on"),
                                             (" ALWAYS_OFF ", "always_off"), ("trace_based", "trace_based"),
                                             ("sometimes", "trace_based")])
def test_the_standard_variable_chooses_the_exemplar_filter(value, expected, caplog):
    settings = TelemetrySettings.from_env({OTEL_METRICS_EXEMPLAR_FILTER: value})
    assert settings.exemplar_filter == expected
    assert settings.exemplars == (expected != "always_off")
    if value == "sometimes":
        assert OTEL_METRICS_EXEMPLAR_FILTER in caplog.text
    with pytest.raises(ValueError):
        TelemetrySettings(exemplar_filter="sometimes")


def test_the_push_carries_the_exemplars():
    telemetry, exporter, reader = in_memory_telemetry()
    clock = ClockOffset.measure()
    record_request(_request(clock), telemetry.tracer, telemetry.requests, clock)
    telemetry.span_processor.force_flush()
    root = _root(exporter).context
    otlp = encode_metrics(reader.get_metrics_data())  # what SidecarMetricExporter sends
    [metric] = [m for rm in otlp.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == GEN_AI_SERVER_TIME_TO_FIRST_TOKEN]
    [exemplar] = metric.histogram.data_points[0].exemplars
    assert exemplar.trace_id == root.trace_id.to_bytes(16, "big")
    assert exemplar.span_id == root.span_id.to_bytes(8, "big")
    assert [(kv.key, kv.value.string_value) for kv in exemplar.filtered_attributes] == [
        (EXEMPLAR_REQUEST_ID, "chatcmpl-abc")]


# -- the sidecar's side: /metrics -----------------------------------------------------------------------------

def _exemplars_in(text: str, sample_name: str) -> list:
    """(sample labels, exemplar) of every ``sample_name`` sample with an exemplar, from an OpenMetrics body."""
    return [(s.labels, s.exemplar) for f in openmetrics_families(text) for s in f.samples
            if s.name == sample_name and s.exemplar is not None]


def _sample_set(families) -> set:
    return {(s.name, frozenset(s.labels.items()), s.value) for f in families for s in f.samples}


async def test_metrics_serves_openmetrics_with_exemplars_when_asked_and_text_otherwise(aiohttp_client):
    application = web.Application()
    add_metrics_routes(application, push_token=TOKEN)
    application[CAPTURE_METRICS].observe("done", steps=3, nbytes=100, duration_s=0.5)
    client = await aiohttp_client(application)
    spans = InMemorySpanExporter()
    sdk_push = PeriodicExportingMetricReader(
        SidecarMetricExporter(str(client.make_url("/v1/metrics")), token_provider=lambda: TOKEN),
        export_interval_millis=3_600_000)
    telemetry = Telemetry(TelemetrySettings(span_schedule_delay_ms=10),
                          Resource({"service.name": "vllm", "service.instance.id": "a", "process.pid": 1}),
                          span_exporter=spans, metric_readers=[sdk_push])
    clock = ClockOffset.measure()
    record_request(_request(clock, request_id="cmpl-1-0"), telemetry.tracer, telemetry.requests, clock)
    record_request(_request(clock, request_id="cmpl-2-0", finish_reason="abort"), telemetry.tracer,
                   telemetry.requests, clock)
    await asyncio.get_running_loop().run_in_executor(None, sdk_push.force_flush)
    telemetry.span_processor.force_flush()
    by_request = {s.attributes["gen_ai.response.id"]: s.context for s in spans.get_finished_spans()
                  if "gen_ai.response.id" in s.attributes}

    om = await client.get("/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    assert om.status == 200 and om.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    body = await om.text()
    assert body.endswith("# EOF\n") and body.count("# EOF") == 1
    found = _exemplars_in(body, TTFT_BUCKETS)
    [(labels, exemplar)] = found  # the aborted request has no time to first token
    context = by_request["cmpl-1-0"]
    assert exemplar.labels == {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x"),
                               "request_id": "cmpl-1-0"}
    assert float(labels["le"]) >= exemplar.value and exemplar.timestamp is not None
    durations = {e.labels["request_id"]: e.labels["trace_id"]
                 for _, e in _exemplars_in(body, "gen_ai_server_request_duration_seconds_bucket")}
    assert durations == {rid: format(c.trace_id, "032x") for rid, c in by_request.items()}

    text = await client.get("/metrics")  # no Accept: the text format, exactly as before
    assert text.headers["Content-Type"] == CONTENT_TYPE_LATEST
    plain = await text.text()
    store, registry = application[METRICS_STORE], application[METRICS_REGISTRY]
    assert plain.encode() == store.render(registry)
    assert " # {" not in plain and "# EOF" not in plain
    for accept in ("text/plain;version=0.0.4", "*/*", "application/json"):
        again = await client.get("/metrics", headers={"Accept": accept})
        assert again.headers["Content-Type"] == CONTENT_TYPE_LATEST and await again.text() == plain, accept
    # Every sample of the one is a sample of the other, with the same labels and value.
    assert _sample_set(openmetrics_families(body)) == _sample_set(text_families(plain))
    await asyncio.get_running_loop().run_in_executor(None, telemetry.shutdown)


def _exemplar(value: float, time_s: float, request_id: str | None = "cmpl-1-0", trace_id: bytes = b"\x01" * 16,
              span_id: bytes = b"\x02" * 8, **attributes: str) -> Exemplar:
    if request_id is not None:
        attributes = {EXEMPLAR_REQUEST_ID: request_id, **attributes}
    return Exemplar(as_double=value, time_unix_nano=int(time_s * 1e9), trace_id=trace_id, span_id=span_id,
                    filtered_attributes=[KeyValue(key=k, value=AnyValue(string_value=v)) for k, v in attributes.items()])


def _ttft(counts: list[int], *exemplars: Exemplar, bounds: tuple = (0.1, 1.0)):
    metric = histogram("gen_ai.server.time_to_first_token", list(bounds), counts)
    metric.unit = "s"
    metric.histogram.data_points[0].exemplars.extend(exemplars)
    return request(1, metric)


async def _openmetrics(client) -> str:
    resp = await client.get("/metrics", headers={"Accept": OPENMETRICS_ACCEPT})
    assert resp.status == 200
    return await resp.text()


def _by_bucket(text: str) -> dict[str, tuple]:
    return {labels["le"]: (e.labels.get("request_id"), e.value) for labels, e in _exemplars_in(text, TTFT_BUCKETS)}


async def test_each_bucket_keeps_its_latest_exemplar_across_pushes(aiohttp_client):
    client = await aiohttp_client(app())
    now = time.time()
    await push(client, _ttft([1, 0, 0], _exemplar(0.05, now, "a")))
    assert _by_bucket(await _openmetrics(client)) == {"0.1": ("a", 0.05)}
    # The SDK sends an exemplar once: the next push of the same point has none, and "a" stays.
    await push(client, _ttft([1, 0, 0]))
    assert _by_bucket(await _openmetrics(client)) == {"0.1": ("a", 0.05)}
    # A newer one in the same bucket replaces it; one in another bucket joins it; two in one push: the latest.
    await push(client, _ttft([2, 1, 1], _exemplar(0.07, now + 2, "c"), _exemplar(0.06, now + 1, "b"),
                             _exemplar(0.5, now + 1, "d"), _exemplar(7.0, now + 1, "e")))
    assert _by_bucket(await _openmetrics(client)) == {"0.1": ("c", 0.07), "1.0": ("d", 0.5), "+Inf": ("e", 7.0)}
    # Other bounds are another histogram: what was kept for the old one goes.
    await push(client, _ttft([1, 0, 0], bounds=(0.2, 2.0)))
    assert _by_bucket(await _openmetrics(client)) == {}


async def test_exemplar_labels_stay_within_openmetrics_128_characters(aiohttp_client):
    client = await aiohttp_client(app())
    now = time.time()
    ids = len("trace_id") + 32 + len("span_id") + 16
    fits = "r" * (EXEMPLAR_MAX_CHARS - ids - len("request_id"))  # 55 characters: kept whole
    await push(client, _ttft([1, 1, 0], _exemplar(0.05, now, fits), _exemplar(0.5, now, fits + "x")))
    text = await _openmetrics(client)
    found = {labels["le"]: e.labels for labels, e in _exemplars_in(text, TTFT_BUCKETS)}
    assert found["0.1"]["request_id"] == fits
    assert found["1.0"] == {"trace_id": "01" * 16, "span_id": "02" * 8}  # one more: left out, never cut
    assert all(sum(len(k) + len(v) for k, v in labels.items()) <= EXEMPLAR_MAX_CHARS for labels in found.values())
    # Characters, not bytes: 55 non-ASCII characters fit too.
    await push(client, _ttft([2, 1, 0], _exemplar(0.05, now + 1, "é" * len(fits))))
    assert _by_bucket(await _openmetrics(client))["0.1"] == ("é" * len(fits), 0.05)
    # Without the ids (an exemplar recorded outside a span), other attributes may take the room; an
    # attribute that is no label name, ids of the wrong length and a value that is no number are left out.
    await push(client, _ttft([3, 2, 1], _exemplar(0.05, now + 2, None, b"", b"", **{"a.b": "x" * 100}),
                             _exemplar(0.5, now + 2, "short", b"\x01" * 20, b"\x00" * 8, **{"": "y"}),
                             _exemplar(float("nan"), now + 2, "nan")))
    found = {labels["le"]: e.labels for labels, e in _exemplars_in(await _openmetrics(client), TTFT_BUCKETS)}
    assert found["0.1"] == {"a_b": "x" * 100}
    assert found["1.0"] == {"request_id": "short"}
    assert "+Inf" not in found


# -- docs ----------------------------------------------------------------------------------------------------

def test_telemetry_md_names_the_exemplar_labels_the_histograms_and_the_variable():
    """docs/telemetry.md's "Exemplars:" paragraph names the histograms that have them and, in its
    "Exemplar labels:" sentence, exactly the labels the sidecar serves."""
    text = (ROOT / "docs" / "telemetry.md").read_text()
    [paragraph] = re.findall(r"^Exemplars: (.*?)\n\n", text, re.S | re.M)
    [sentence] = re.findall(r"Exemplar labels: (.*?)\.\s+[A-Z]", paragraph, re.S)
    assert set(re.findall(r"`([a-z_]+)`", sentence)) == {TRACE_ID_LABEL, SPAN_ID_LABEL, EXEMPLAR_REQUEST_ID}
    histograms = {f"{metric_name(name)}_{unit_suffix('s')}" for name in REQUEST_HISTOGRAMS}
    assert histograms <= set(re.findall(r"`([a-z_]+)`", paragraph)), histograms
    assert str(EXEMPLAR_MAX_CHARS) in paragraph
    assert f"| `{OTEL_METRICS_EXEMPLAR_FILTER}` | `{DEFAULT_EXEMPLAR_FILTER}` |" in text


# -- a real Prometheus --------------------------------------------------------------------------------------------

async def test_real_prometheus_stores_the_exemplars_of_an_openmetrics_scrape(tmp_path):
    """Prometheus scrapes OpenMetrics (it asks for it), accepts the whole scrape, and
    /api/v1/query_exemplars returns each request's trace and span ids."""
    application = web.Application()
    add_metrics_routes(application)
    runner = web.AppRunner(application)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    spans = InMemorySpanExporter()
    telemetry = Telemetry(TelemetrySettings(sidecar_metrics_url=f"http://127.0.0.1:{port}/v1/metrics",
                                            metrics_push_interval_ms=200, span_schedule_delay_ms=10),
                          Resource({"service.name": "vllm", "service.instance.id": "p", "process.pid": 1}),
                          span_exporter=spans, token_provider=lambda: None)
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{port}"], interval_s=0.2, features=("exemplar-storage",))
    loop = asyncio.get_running_loop()
    try:
        start = time.time() - 1
        clock = ClockOffset.measure()
        sent = [f"chatcmpl-{i}" for i in range(3)]
        for i, request_id in enumerate(sent):
            # Different times to first token: three buckets, so none replaces another before a scrape.
            req = _request(clock, request_id=request_id, time_to_first_token=0.003 * 10 ** i)
            record_request(req, telemetry.tracer, telemetry.requests, clock)
        telemetry.span_processor.force_flush()
        want = {s.attributes["gen_ai.response.id"]: (format(s.context.trace_id, "032x"), format(s.context.span_id, "016x"))
                for s in spans.get_finished_spans() if "gen_ai.response.id" in s.attributes}
        assert set(want) == set(sent)
        deadline = time.monotonic() + 30
        while True:
            target = await loop.run_in_executor(None, prometheus.wait_scraped)
            series = await loop.run_in_executor(None, prometheus.exemplars, TTFT_BUCKETS, start)
            got = {e["labels"]["request_id"]: (e["labels"]["trace_id"], e["labels"]["span_id"])
                   for s in series for e in s["exemplars"]}
            if got == want or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
        assert got == want
        assert target["lastError"] == "" and target["health"] == "up"
        assert prometheus.value('up{job="sidecar"}') == 1
        # The series the exemplars belong to are the buckets Prometheus stored from the same scrapes.
        assert all(s["seriesLabels"]["__name__"] == TTFT_BUCKETS for s in series)
    finally:
        prometheus.stop()
        await loop.run_in_executor(None, telemetry.shutdown)
        await runner.cleanup()
