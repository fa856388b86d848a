"""An Alertmanager alert against real probes in a real process (tests/fake_engine.py): it starts a capture,
which ends done and names the alert in its JSON, capture.json, its report and (through its verdict)
the API server's capture span; the firing saves the flight recorder and is an ``alert_firing`` span."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.common.protocol import Verdict
from sidecar.service.incidents import alerts as alerts_module
from sidecar.service.incidents.alert_actions import parse_alert_actions_file
from sidecar.service.jobs.captures import started_by
from sidecar.service.routes.keys import CAPTURES
from sidecar.telemetry.capture import record_capture, record_from_verdict
from test_service import engines, sidecar, wait_final, wait_processes  # noqa: F401 (fixtures)


def _provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    return provider, spans


async def test_an_alert_captures_the_engine_and_the_capture_says_why(sidecar, engines, monkeypatch):
    provider, spans = _provider()
    # The sidecar's tracer is the global one; this test's own provider stands in for it.
    monkeypatch.setattr(alerts_module.trace, "get_tracer", lambda *a, **k: provider.get_tracer("test"))
    actions = parse_alert_actions_file(json.dumps([{"match": {"alertname": "InferenceTimeToFirstTokenHigh"},
                                                    "action": {"capture_steps": 3, "recorder_seconds": 30}}]), 50)
    client = await sidecar(alert_actions=tuple(actions))
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20")
    await wait_processes(client, 1)
    starts_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 2))
    labels = {"alertname": "InferenceTimeToFirstTokenHigh", "instance": f"127.0.0.1:{client.port}",
              "gen_ai_request_model": "tiny", "severity": "warning"}
    body = {"version": "4", "status": "firing", "receiver": "sidecar", "groupLabels": {}, "commonLabels": labels,
            "alerts": [{"status": "firing", "labels": labels, "annotations": {}, "startsAt": starts_at,
                        "endsAt": "0001-01-01T00:00:00Z", "fingerprint": "5e4bd1c6f2a3b7e0"}]}
    answer = await (await client.post("/alerts", json=body)).json()
    assert answer["fired"] == 1, answer
    for _ in range(300):
        firing = (await (await client.get("/alerts")).json())["firings"][0]
        if firing["capture"] and (firing["recorder"] or firing["recorder_error"]):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(firing)
    assert firing["id"] == answer["alerts"][0]["firing"] and firing["recorder_error"] is None
    assert firing["arm_latency_ms"] < firing["start_to_armed_ms"], firing  # startsAt was 2 s before the post
    dump = json.loads(gzip.decompress(Path(firing["recorder"]).read_bytes()))
    assert Path(firing["recorder"]).parent.name == "alerts" and dump["processes"][0]["steps"]

    capture = await wait_final(client, firing["capture"])
    assert capture["state"] == "done", capture
    stamp = {"name": "InferenceTimeToFirstTokenHigh", "labels": labels, "fingerprint": "5e4bd1c6f2a3b7e0",
             "starts_at": starts_at, "firing": firing["id"]}
    assert capture["alert"] == stamp and capture["trigger"] is None
    manager = client.server.app[CAPTURES]
    saved = json.loads((manager.get(capture["id"]).dir / "capture.json").read_text())
    assert saved["alert"] == stamp
    report = await client.get(f"/profile/{capture['id']}/report", headers={"Accept": "text/html"})
    page = await report.text()
    assert report.status == 200 and "Why this capture" in page and "InferenceTimeToFirstTokenHigh" in page
    assert "5e4bd1c6f2a3b7e0" in page and starts_at in page

    # The verdict the capture's processes get names the alert; the API server's capture span says it.
    cause = started_by(manager.get(capture["id"]))
    assert (cause.kind, cause.name, cause.id, cause.starts_at, cause.labels) == (
        "alert", "InferenceTimeToFirstTokenHigh", "5e4bd1c6f2a3b7e0", starts_at, labels)
    verdict = Verdict(job_id=capture["id"], state="done", steps=3, processes=1, started_by=cause)
    record_capture(record_from_verdict(capture["id"], time.time() - 1, time.time(), verdict, client.url, "done"),
                   provider.get_tracer("test"))
    by_name = {s.name: s for s in spans.get_finished_spans()}
    attrs = by_name["sidecar capture"].attributes
    assert attrs["sidecar.capture.alert.name"] == "InferenceTimeToFirstTokenHigh"
    assert attrs["sidecar.capture.alert.fingerprint"] == "5e4bd1c6f2a3b7e0"
    assert attrs["sidecar.capture.alert.starts_at"] == starts_at
    assert "instance=127.0.0.1:%d" % client.port in attrs["sidecar.capture.alert.labels"]
    fired = by_name[alerts_module.SPAN_NAME].attributes
    assert fired["sidecar.alert.outcome"] == "fired" and fired["sidecar.alert.capture"] == capture["id"]
    assert fired["sidecar.alert.fingerprint"] == "5e4bd1c6f2a3b7e0" and fired["sidecar.alert.recorder"] == firing["recorder"]
    assert fired["sidecar.alert.start_to_armed_ms"] == firing["start_to_armed_ms"]
    page = await (await client.get("/", headers={"Accept": "text/html"})).text()
    assert "alert InferenceTimeToFirstTokenHigh" in page


def test_a_trigger_capture_names_its_trigger_in_the_span_too():
    provider, spans = _provider()
    from sidecar.common.protocol import StartedBy

    verdict = Verdict(job_id="20261123-070102-9c1d2e", state="done",
                      started_by=StartedBy(kind="trigger", name="step_duration step > 1000 ms", id="trg-3f9a1c2e"))
    record_capture(record_from_verdict("20261123-070102-9c1d2e", 1.0, 2.0, verdict, "http://127.0.0.1:8787", "done"),
                   provider.get_tracer("test"))
    (span,) = spans.get_finished_spans()
    assert span.attributes["sidecar.capture.trigger.id"] == "trg-3f9a1c2e"
    assert span.attributes["sidecar.capture.trigger.name"] == "step_duration step > 1000 ms"
    assert not any(k.startswith("sidecar.capture.alert.") for k in span.attributes)
