"""Issue 10, defect 3: what one process pushes can never break /metrics for the others. A series
Prometheus could not show is refused at push time, counted in
``sidecar_metric_push_dropped_total{reason}`` and named in the push's OTLP ``partial_success``; a scrape
renders every family it can and skips (and logs) one it cannot."""

import asyncio
import logging
import shutil
import subprocess

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceResponse

from sidecar.service.metrics import store as metrics_store
from sidecar.service.routes.metrics import CAPTURE_METRICS, METRICS_STORE

from .metric_pushes import app, counter, gauge, histogram, push, request, samples


async def _scrape(client) -> str:
    resp = await client.get("/metrics")
    assert resp.status == 200, await resp.text()
    text = await resp.text()
    _assert_prometheus_parses(text)
    return text


def _assert_prometheus_parses(text: str) -> None:
    """Prometheus's own parser (promtool) is stricter than prometheus_client's: a second HELP or TYPE
    line for one name, or an empty label name, fails the whole scrape there."""
    samples(text)
    if shutil.which("promtool"):
        done = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)
        assert b"parsing error" not in done.stdout + done.stderr, (done.stdout + done.stderr).decode()


def _dropped(text: str) -> dict[str, float]:
    """The non-zero drop counts by reason (every reason is exported from 0)."""
    counts = {labels["reason"]: value for labels, value in samples(text)["sidecar_metric_push_dropped_total"]}
    assert {"invalid_name", "invalid_label_name", "invalid_histogram", "conflicting_type", "unsupported"} <= set(counts)
    return {reason: value for reason, value in counts.items() if value}


async def test_bad_series_are_dropped_at_push_and_counted(aiohttp_client):
    client = await aiohttp_client(app())
    assert (await push(client, request(1, gauge("healthy.gauge", 2.0)))).status == 200

    bad = request(2,
                  gauge("still.fine", 3.0),
                  gauge(""),  # no name at all
                  counter("_total"),  # nothing left once the counter suffix goes
                  gauge("..."),  # sanitised to nothing but underscores
                  gauge("empty.label", attrs={"": "x"}),
                  gauge("sanitised.label", attrs={"__name__": "x"}),  # becomes "_name_": kept
                  histogram("no.buckets", [], []),  # OTLP allows it: everything in +Inf, kept
                  histogram("le.label", [1.0], [1, 2], attrs={"le": "x"}),
                  histogram("short.buckets", [1.0, 2.0], [1]),  # bucket counts must be one more than bounds
                  histogram("unsorted.bounds", [2.0, 1.0], [1, 1, 1]))
    resp = await push(client, bad)
    assert resp.status == 200
    text = await _scrape(client)
    answer = ExportMetricsServiceResponse.FromString(await resp.read())
    assert answer.partial_success.rejected_data_points == 7
    assert "'empty.label': invalid_label_name" in answer.partial_success.error_message
    got = samples(text)
    assert got["healthy_gauge"][0][1] == 2.0 and got["still_fine"][0][1] == 3.0
    assert got["sanitised_label"][0][0]["_name_"] == "x"
    assert [labels["le"] for labels, _ in got["no_buckets_bucket"]] == ["+Inf"]
    assert not any(name.startswith(("empty_label", "le_label", "short_buckets", "unsorted_bounds")) for name in got)
    assert _dropped(text) == {"invalid_name": 3, "invalid_label_name": 2, "invalid_histogram": 2}


async def test_one_name_keeps_one_type_across_processes(aiohttp_client):
    # Stale after a minute until the check of staleness below: a loaded host can take longer than
    # a fraction of a second over the pushes and the scrape before it.
    client = await aiohttp_client(app(stale_after_s=60))
    assert (await push(client, request(1, counter("queue.depth", 4)))).status == 200
    # Another process, the same name as a gauge: one family cannot be both; the first one stays.
    resp = await push(client, request(2, gauge("queue.depth", 9.0), gauge("queue.depth_total", 9.0),
                                      gauge("other", 1.0)))
    answer = ExportMetricsServiceResponse.FromString(await resp.read())
    assert answer.partial_success.rejected_data_points == 2 and "conflicting_type" in answer.partial_success.error_message
    # The same name twice in one push, once per type: the first one is kept.
    resp = await push(client, request(3, gauge("twice", 1.0), counter("twice", 5)))
    assert ExportMetricsServiceResponse.FromString(await resp.read()).partial_success.rejected_data_points == 1

    text = await _scrape(client)
    got = samples(text)
    assert [(labels["process_pid"], value) for labels, value in got["queue_depth_total"]] == [("1", 4.0)]
    assert "queue_depth" not in got and len(got["twice"]) == 1 and "twice_total" not in got
    assert _dropped(text) == {"conflicting_type": 3}

    # Once the counter's process has gone stale, its name is free again.
    client.app[METRICS_STORE].stale_after_s = 0.05
    await asyncio.sleep(0.1)
    assert (await push(client, request(2, gauge("queue.depth", 9.0)))).status == 200  # the others expire first
    client.app[METRICS_STORE].stale_after_s = 60  # this push stays until the scrape after it
    assert samples(await _scrape(client))["queue_depth"][0][1] == 9.0


async def test_pushed_series_never_shadow_the_sidecars_own_metrics(aiohttp_client):
    client = await aiohttp_client(app())
    client.app[CAPTURE_METRICS].observe("done", steps=5, nbytes=1000, duration_s=1.5)
    resp = await push(client, request(1, gauge("sidecar_captures_total", 7.0), gauge("target_info", 1.0),
                                      counter("sidecar.capture.bytes", 3)))
    answer = ExportMetricsServiceResponse.FromString(await resp.read())
    assert answer.partial_success.rejected_data_points == 3
    got = samples(await _scrape(client))
    assert got["sidecar_captures_total"] == [({"state": "done"}, 1.0)]
    assert got["sidecar_capture_bytes_total"] == [({}, 1000.0)]
    assert [labels["process_pid"] for labels, _ in got["target_info"]] == ["1"]


async def test_a_family_that_cannot_render_is_skipped_not_a_500(aiohttp_client, monkeypatch, caplog):
    """Validation keeps bad series out; should one still fail to render, only it is missing."""
    client = await aiohttp_client(app())
    assert (await push(client, request(1, gauge("good", 1.0), gauge("doomed", 2.0), gauge("also.good", 3.0)))).status == 200
    real_family = metrics_store.family

    def family(name, *args, **kwargs):
        if name == "doomed":
            raise ValueError("cannot render this one")
        return real_family(name, *args, **kwargs)

    monkeypatch.setattr(metrics_store, "family", family)
    with caplog.at_level(logging.WARNING, logger="sidecar.service.metrics.store"):
        got = samples(await _scrape(client))
    assert got["good"][0][1] == 1.0 and got["also_good"][0][1] == 3.0 and "doomed" not in got
    assert "doomed" in caplog.text and "cannot render this one" in caplog.text
