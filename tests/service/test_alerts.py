"""``POST /alerts`` (Alertmanager's webhook) without an engine: every bad body is a JSON 4xx naming its
field and fires nothing; each alert's outcome (resolved, another server, a duplicate, no action, the
limits); a storm fires at most the budget and never holds the service; the token guards it."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from sidecar.service.incidents import alerts as alerts_module
from sidecar.service.incidents.alert_actions import parse_alert_actions_file
from sidecar.service.incidents.alert_payload import MAX_ALERTS
from sidecar.service.jobs.captures import CaptureManager
from sidecar.service.routes.alerts import MAX_BODY_BYTES
from test_service import sidecar  # noqa: F401 (fixtures)

STARTS = "2026-11-23T07:01:01.52Z"


def actions(*entries: dict) -> tuple:
    return tuple(parse_alert_actions_file(json.dumps(list(entries)), 50))


def alert(name: str = "InferenceTimeToFirstTokenHigh", *, status: str = "firing", starts: str = STARTS,
          fingerprint: str | None = None, **labels: str) -> dict:
    body = {"status": status, "labels": {"alertname": name, **labels}, "annotations": {"summary": "slow"},
            "startsAt": starts, "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "http://prometheus/graph"}
    if fingerprint is not None:
        body["fingerprint"] = fingerprint
    return body


def notification(*alerts: dict) -> dict:
    return {"version": "4", "groupKey": "{}:{alertname=\"x\"}", "truncatedAlerts": 0, "status": "firing",
            "receiver": "sidecar", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
            "externalURL": "http://alertmanager:9093", "alerts": list(alerts)}


GOOD = alert(fingerprint="5e4bd1c6f2a3b7e0")


@pytest.mark.parametrize("body, param", [
    ({"version": "3", "alerts": []}, "version"),
    ({"alerts": [GOOD]}, "version"),
    ({"version": "4"}, "alerts"),
    ({"version": "4", "alerts": {"0": GOOD}}, "alerts"),
    (notification(GOOD, "an alert"), "alerts[1]"),
    (notification(GOOD, {**GOOD, "status": "pending"}), "alerts[1].status"),
    (notification({**GOOD, "labels": ["alertname"]}), "alerts[0].labels"),
    (notification({**GOOD, "labels": {"alertname": "x", "instance": 8787}}), "alerts[0].labels.instance"),
    (notification({**GOOD, "labels": {"alertname": "x" * 2000}}), "alerts[0].labels.alertname"),
    (notification({**GOOD, "labels": {f"l{i}": "v" for i in range(65)}}), "alerts[0].labels"),
    (notification({k: v for k, v in GOOD.items() if k != "startsAt"}), "alerts[0].startsAt"),
    (notification({**GOOD, "startsAt": "yesterday"}), "alerts[0].startsAt"),
    (notification({**GOOD, "fingerprint": "../../etc"}), "alerts[0].fingerprint"),
    (notification(*[GOOD] * (MAX_ALERTS + 1)), "alerts"),
    ([GOOD], "body"),
])
async def test_a_bad_notification_is_a_400_naming_the_field_and_fires_nothing(sidecar, body, param):
    client = await sidecar(alert_actions=actions({"match": {}}))
    resp = await client.post("/alerts", json=body)
    assert resp.status == 400, await resp.text()
    answer = await resp.json()
    assert answer["error"] == "bad_parameter" and answer["param"] == param, answer
    listed = await (await client.get("/alerts")).json()
    assert not any(listed["counts"].values()) and not listed["firings"], "a bad notification acts on none of its alerts"


async def test_a_body_that_is_no_json_too_large_or_of_another_type_is_refused_in_json(sidecar):
    client = await sidecar(alert_actions=actions({"match": {}}))
    resp = await client.post("/alerts", data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["param"] == "body"
    resp = await client.post("/alerts", data=b"<alerts/>", headers={"Content-Type": "application/xml"})
    assert resp.status == 415 and (await resp.json())["error"] == "unsupported_media_type"
    big = json.dumps(notification(alert(description="x" * 1000))).encode() + b" " * MAX_BODY_BYTES
    resp = await client.post("/alerts", data=big, headers={"Content-Type": "application/json"})
    assert resp.status == 413 and (await resp.json())["error"] == "too_large"

    async def chunks():  # no Content-Length: counted as it arrives
        yield json.dumps(notification(GOOD)).encode()
        for _ in range(MAX_BODY_BYTES // (1 << 16) + 1):
            yield b" " * (1 << 16)

    resp = await client.post("/alerts", data=chunks(), headers={"Content-Type": "application/json"})
    assert resp.status == 413 and (await resp.json())["error"] == "too_large"
    assert (await client.get("/healthz")).status == 200


async def test_each_alert_gets_its_outcome_with_the_reason(sidecar, monkeypatch):
    monkeypatch.setenv("POD_NAME", "vllm-0")
    client = await sidecar(alert_actions=actions({"match": {"alertname": "InferenceTimeToFirstTokenHigh"}}))
    own = f"127.0.0.1:{client.port}"
    body = notification(
        alert(instance=own, fingerprint="aaaa000000000001"),  # fires (no engine: its capture is skipped)
        alert(status="resolved", instance=own, fingerprint="aaaa000000000002"),
        alert(instance="10.0.3.7:8787", fingerprint="aaaa000000000003"),
        alert(instance=f"127.0.0.1:{client.port + 1}", fingerprint="aaaa000000000004"),  # this host, another port
        alert(pod="vllm-1", instance=own, fingerprint="aaaa000000000005"),  # the pod decides
        alert("InferenceQueueTimeHigh", fingerprint="aaaa000000000006"),  # no instance: this server's; no action
        alert(pod="vllm-0", instance="10.0.3.7:8787", fingerprint="aaaa000000000007"),  # its pod: this one; cooldown
    )
    answer = await (await client.post("/alerts", json=body)).json()
    outcomes = [(a["fingerprint"][-1], a["outcome"], a["reason"]) for a in answer["alerts"]]
    assert outcomes == [("1", "fired", None), ("2", "skipped", "resolved"), ("3", "skipped", "other_server"),
                        ("4", "skipped", "other_server"), ("5", "skipped", "other_server"),
                        ("6", "skipped", "no_action"), ("7", "skipped", "cooldown")], answer
    assert answer["received"] == 7 and answer["fired"] == 1 and answer["skipped"] == 6
    assert "10.0.3.7:8787" in answer["alerts"][2]["detail"] and "--alert-instance" in answer["alerts"][2]["detail"]
    assert "'vllm-0'" in answer["alerts"][4]["detail"]
    # Alertmanager sends a firing alert again at each group change and every repeat_interval: acted on once.
    again = await (await client.post("/alerts", json=body)).json()
    assert [a["reason"] for a in again["alerts"]] == ["duplicate", "resolved", "other_server", "other_server",
                                                      "other_server", "duplicate", "duplicate"]
    # The same alert firing anew (a new startsAt) is a new firing: its action's cooldown refuses it here.
    anew = await (await client.post("/alerts", json=notification(
        alert(instance=own, fingerprint="aaaa000000000001", starts="2026-11-23T09:00:00Z")))).json()
    assert anew["alerts"][0]["reason"] == "cooldown"

    listed = await (await client.get("/alerts")).json()
    assert listed["counts"] == {"fired": 1, "resolved": 2, "other_server": 6, "duplicate": 3, "no_action": 1,
                                "cooldown": 2, "budget": 0}
    assert listed["own"] == {"pod": "vllm-0", "instances": []}
    assert listed["actions"][0]["fired_last_hour"] == 1
    (firing,) = listed["firings"]
    assert firing["id"] == answer["alerts"][0]["firing"] and firing["action"] == 0
    assert firing["alert"] == {"name": "InferenceTimeToFirstTokenHigh", "labels": body["alerts"][0]["labels"],
                               "fingerprint": "aaaa000000000001", "starts_at": STARTS}
    for _ in range(100):  # the firing runs on a task of its own: no engine, so its capture is skipped
        firing = (await (await client.get("/alerts")).json())["firings"][0]
        if firing["capture_skipped"]:
            break
        await asyncio.sleep(0.05)
    assert "no engine process" in firing["capture_skipped"] and firing["capture"] is None
    assert [s["reason"] for s in listed["skipped"]][:2] == ["cooldown", "duplicate"]
    metrics = await (await client.get("/metrics")).text()
    assert 'sidecar_alert_firings_total{alertname="InferenceTimeToFirstTokenHigh",outcome="fired"} 1.0' in metrics
    assert 'sidecar_alert_firings_total{alertname="InferenceQueueTimeHigh",outcome="skipped"} 2.0' in metrics


async def test_alert_instance_names_the_server(sidecar):
    client = await sidecar(alert_actions=actions({"match": {}}), alert_instances=("sidecar:8787",))
    answer = await (await client.post("/alerts", json=notification(
        alert(instance=f"127.0.0.1:{client.port}", fingerprint="b1"), alert(instance="sidecar:8787", fingerprint="b2"),
    ))).json()
    assert [(a["outcome"], a["reason"]) for a in answer["alerts"]] == [("skipped", "other_server"), ("fired", None)]
    assert "sidecar:8787 (--alert-instance)" in answer["alerts"][0]["detail"]


async def test_without_alert_actions_every_alert_is_skipped(sidecar):
    client = await sidecar()
    answer = await (await client.post("/alerts", json=notification(alert(fingerprint="c1")))).json()
    assert answer["alerts"][0]["reason"] == "no_action" and "none of the 0" in answer["alerts"][0]["detail"]
    assert (await (await client.get("/alerts")).json())["actions"] == []


async def test_the_token_guards_the_webhook(sidecar):
    client = await sidecar(http_token="api-token-for-the-alerts-test", alert_actions=actions({"match": {}}))
    assert (await client.post("/alerts", json=notification(GOOD))).status == 401
    assert (await client.get("/alerts")).status == 401
    resp = await client.post("/alerts", json=notification(GOOD),
                             headers={"Authorization": "Bearer api-token-for-the-alerts-test"})
    assert resp.status == 200 and (await resp.json())["fired"] == 1


class SlowClock:
    """``time`` as the alerts module sees it, with its monotonic clock moved on at will (the limits')."""

    def __init__(self) -> None:
        self.ahead_s = 0.0

    def __getattr__(self, name):
        return getattr(time, name)

    def monotonic(self) -> float:
        return time.monotonic() + self.ahead_s


async def test_a_storm_fires_at_most_the_budget_and_never_holds_the_service(sidecar, monkeypatch):
    clock = SlowClock()
    monkeypatch.setattr(alerts_module, "time", clock)
    # Every capture start waits until the test lets it go: the answers must not wait for it.
    released = asyncio.Event()
    starts = []

    async def held_start(self, request):
        starts.append(request)
        await released.wait()
        raise RuntimeError("not started: the test only counts starts")

    monkeypatch.setattr(CaptureManager, "start", held_start)
    client = await sidecar(alert_actions=actions({"match": {}, "cooldown_s": 60, "budget_per_hour": 3,
                                                  "action": {"capture_steps": 2, "recorder_seconds": 0}}))
    own = f"127.0.0.1:{client.port}"
    posts, fired, health = 5, 0, []
    for round_ in range(posts):
        # 500 alerts, new ones each round (a new startsAt), sent twice at once beside health checks.
        body = notification(*[alert(instance=own, pod_index=str(i), starts=f"2026-11-23T07:0{round_}:00Z")
                              for i in range(500)])
        answers = await asyncio.gather(client.post("/alerts", json=body), client.post("/alerts", json=body),
                                       *[client.get("/healthz") for _ in range(5)])
        for resp in answers[2:]:
            health.append(resp.status)
        for resp in answers[:2]:
            assert resp.status == 200, await resp.text()
            answer = await resp.json()
            assert answer["received"] == 500
            fired += answer["fired"]
        clock.ahead_s += 61  # past the cooldown: the next round may fire, within the hour's budget
    assert fired == 3, "one firing a round until the budget of 3 an hour is spent"
    assert health == [200] * 5 * posts
    # Every answer came while the firings' captures were still being started: none was awaited.
    assert len(starts) == 3 and not released.is_set()
    listed = await (await client.get("/alerts")).json()
    assert listed["counts"]["fired"] == 3 and listed["counts"]["budget"] > 0 and listed["counts"]["cooldown"] > 0
    assert listed["counts"]["duplicate"] == 500 * posts  # the second copy of each round
    assert len(listed["skipped"]) <= alerts_module.KEEP_SKIPPED and len(listed["firings"]) == 3
    released.set()
    for _ in range(100):
        firings = (await (await client.get("/alerts")).json())["firings"]
        if all(f["capture_skipped"] for f in firings):
            break
        await asyncio.sleep(0.05)
    assert all("not started" in f["capture_skipped"] for f in firings)


async def test_alertnames_on_metrics_are_bounded(sidecar):
    client = await sidecar(alert_actions=actions({"match": {}}))
    body = notification(*[alert(f"Alert{i}", fingerprint=f"d{i}") for i in range(alerts_module.MAX_ALERTNAMES + 20)])
    assert (await client.post("/alerts", json=body)).status == 200
    metrics = await (await client.get("/metrics")).text()
    names = {line.split('alertname="')[1].split('"')[0] for line in metrics.splitlines()
             if line.startswith("sidecar_alert_firings_total{")}
    assert len(names) == alerts_module.MAX_ALERTNAMES + 1 and alerts_module.OTHER_NAME in names
