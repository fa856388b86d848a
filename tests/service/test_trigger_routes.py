"""Triggers against real probes in real processes (tests/fake_engine.py): a slow step fires a step rule,
which saves the flight recorder and starts a capture that says which trigger started it."""

import asyncio
import gzip
import json
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.service.incidents import triggers as triggers_module
from test_service import engines, settings, sidecar, wait_final, wait_processes  # noqa: F401 (fixtures)


async def test_a_slow_step_fires_a_step_rule(sidecar, engines, monkeypatch):
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    # The sidecar's tracer is the global one; this test's own provider stands in for it.
    monkeypatch.setattr(triggers_module.trace, "get_tracer", lambda *a, **k: provider.get_tracer("test"))
    client = await sidecar()
    resp = await client.post("/triggers", json={"metric": "step_duration", "threshold_ms": 300, "cooldown_s": 60,
                                                "action": {"capture_steps": 3, "recorder_seconds": 30}})
    assert resp.status == 201, await resp.text()
    trigger = await resp.json()
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20", "--slow-step-at", "40", "--slow-step-ms", "500")
    await wait_processes(client, 1)
    for _ in range(200):
        body = await (await client.get(f"/triggers/{trigger['id']}")).json()
        fired = [f for f in body["firings"] if f["outcome"] == "fired" and f["recorder"]]
        if fired:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(body)
    firing = fired[-1]
    # A heartbeat came while the slow step ran (it fires then, as for a hung engine), or after it ended.
    assert firing["observed_ms"] > 300 and firing["threshold_ms"] == 300 and firing["step"] % 40 == 0
    assert firing["step_was"] in ("running", "ended")
    assert firing["capture"] and firing["arm_latency_ms"] < 1000
    # The recorder dump holds the slow step, ended or still running when it was taken.
    dump = json.loads(gzip.decompress(Path(firing["recorder"]).read_bytes()))
    (proc,) = dump["processes"]
    assert (any(s["duration_ms"] >= 500 and s["step"] == firing["step"] for s in proc["steps"])
            or proc["open_step"] is not None and proc["open_step"]["age_ms"] > 300), proc["open_step"]
    capture = await wait_final(client, firing["capture"])
    assert capture["state"] == "done", capture
    assert capture["trigger"]["trigger"] == trigger["id"] and capture["trigger"]["observed_ms"] > 300
    # The next slow step (40 steps later) is within the cooldown: skipped, with the reason.
    for _ in range(100):
        body = await (await client.get(f"/triggers/{trigger['id']}")).json()
        if body["counts"]["skipped"]:
            break
        await asyncio.sleep(0.1)
    assert body["firings"][0]["outcome"] == "skipped" and body["firings"][0]["reason"] == "cooldown"
    assert body["counts"]["fired"] == 1
    metrics = await (await client.get("/metrics")).text()
    assert f'sidecar_trigger_firings_total{{outcome="fired",trigger="{trigger["id"]}"}} 1.0' in metrics
    # One span per firing and per skipped breach, with what was seen and what it started.
    by_outcome = {s.attributes["sidecar.trigger.outcome"]: s for s in spans.get_finished_spans()
                  if s.name == triggers_module.SPAN_NAME}
    assert set(by_outcome) == {"fired", "skipped"}
    fired_span = by_outcome["fired"].attributes
    assert fired_span["sidecar.trigger.id"] == trigger["id"] and fired_span["sidecar.trigger.capture"] == firing["capture"]
    assert fired_span["sidecar.trigger.observed_ms"] == firing["observed_ms"]
    assert fired_span["sidecar.trigger.threshold_ms"] == 300.0 and fired_span["sidecar.trigger.metric"] == "step_duration"
    assert by_outcome["skipped"].attributes["sidecar.trigger.reason"] == "cooldown"
    listed = await (await client.get("/triggers")).json()
    assert [t["id"] for t in listed["triggers"]] == [trigger["id"]]
    assert (await client.delete(f"/triggers/{trigger['id']}")).status == 200
    assert (await client.get(f"/triggers/{trigger['id']}")).status == 404


async def test_bad_rules_and_unknown_ids_arm_nothing(sidecar):
    client = await sidecar()
    for body, param in (({"metric": "step_duration", "threshold_ms": -5}, "threshold_ms"),
                        ({"metric": "step_duration", "threshold_ms": 5, "cooldown_s": 0}, "cooldown_s"),
                        ({"metric": "step_duration", "threshold_ms": 5, "budget_per_hour": 0}, "budget_per_hour"),
                        ({"metric": "nope", "threshold_ms": 5}, "metric"),
                        ({"metric": "step_duration", "threshold_ms": 5, "extra": 1}, "extra")):
        resp = await client.post("/triggers", json=body)
        assert resp.status == 400
        assert await resp.json() == {"error": "bad_parameter", "param": param, "message": (await resp.json())["message"]}
    resp = await client.post("/triggers", data="{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["param"] == "body"
    resp = await client.post("/triggers", data="x", headers={"Content-Type": "application/xml"})
    assert resp.status == 415 and "error" in await resp.json()
    # text/plain is what a page on another site can send without asking: refused before the route reads it.
    resp = await client.post("/triggers", data="x", headers={"Content-Type": "text/plain"})
    assert resp.status == 403 and (await resp.json())["error"] == "cross_site_request"
    assert (await (await client.get("/triggers")).json()) == {"triggers": []}
    for method in ("get", "delete"):
        resp = await getattr(client, method)("/triggers/trg-00000000")
        assert resp.status == 404 and (await resp.json())["error"] == "not_found"
