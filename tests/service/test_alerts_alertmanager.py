"""``POST /alerts`` fed by a real Alertmanager (Debian's ``prometheus-alertmanager``) configured as
deploy/alertmanager.yml: it presents the sidecar's token from its ``credentials_file``, its version-4
notifications parse, each alert is decided (one of this server fires, one of another server is
skipped), its resolved notification is recorded; with a wrong token nothing gets through."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

from alert_chain import Alertmanager, alertmanager_config
from sidecar.service.incidents.alert_actions import parse_alert_actions_file
from test_service import sidecar  # noqa: F401 (fixtures)

TOKEN = "a-token-the-alertmanager-presents-0123"


def _rfc3339(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


async def _until(get, ok, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        got = await get()
        if ok(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}: {got}")
        await asyncio.sleep(0.1)


async def test_alertmanager_posts_with_the_token_and_each_alert_is_decided(sidecar, tmp_path):
    actions = parse_alert_actions_file('[{"match": {"alertname": "InferenceQueueTimeHigh"}, '
                                       '"action": {"capture_steps": 2, "recorder_seconds": 0}}]', 50)
    client = await sidecar(http_token=TOKEN, alert_actions=tuple(actions))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    manager = Alertmanager(tmp_path / "am", alertmanager_config(f"{client.url}/alerts", token_file))
    try:
        now = datetime.now(timezone.utc)
        ours = {"alertname": "InferenceQueueTimeHigh", "instance": f"127.0.0.1:{client.port}", "severity": "warning"}
        theirs = {**ours, "instance": "10.0.3.7:8787"}
        await asyncio.to_thread(manager.post_alerts, [
            {"labels": labels, "annotations": {"summary": "queue time"}, "startsAt": _rfc3339(now)}
            for labels in (ours, theirs)])

        async def listed():
            return await (await client.get("/alerts", headers=auth)).json()

        got = await _until(listed, lambda b: b["counts"]["fired"] and b["counts"]["other_server"], "both alerts")
        (firing,) = got["firings"]
        assert firing["alert"]["labels"] == ours and len(firing["alert"]["fingerprint"]) == 16
        assert firing["alert"]["starts_at"].startswith(now.strftime("%Y-%m-%dT%H:%M:%S"))
        assert [s["alert"]["labels"]["instance"] for s in got["skipped"] if s["reason"] == "other_server"] == ["10.0.3.7:8787"]
        # Resolved (endsAt now): Alertmanager says so (send_resolved), and the sidecar records it.
        await asyncio.to_thread(manager.post_alerts, [
            {"labels": ours, "annotations": {}, "startsAt": _rfc3339(now), "endsAt": _rfc3339(datetime.now(timezone.utc))}])
        got = await _until(listed, lambda b: b["counts"]["resolved"], "the resolved notification")
        assert got["counts"]["fired"] == 1 and manager.notifications("failed") == 0
    finally:
        manager.close()

    # The same Alertmanager with a wrong token: refused (401), nothing decided.
    before = await (await client.get("/alerts", headers=auth)).json()
    token_file.write_text("not-the-token-of-this-sidecar-0000")
    manager = Alertmanager(tmp_path / "am-wrong", alertmanager_config(f"{client.url}/alerts", token_file))
    try:
        later = datetime.now(timezone.utc) + timedelta(seconds=1)
        await asyncio.to_thread(manager.post_alerts, [
            {"labels": {"alertname": "InferenceQueueTimeHigh", "instance": f"127.0.0.1:{client.port}", "try": "2"},
             "annotations": {}, "startsAt": _rfc3339(later)}])
        deadline = time.monotonic() + 60
        while manager.notifications("failed") == 0:
            assert time.monotonic() < deadline, "Alertmanager never tried the webhook"
            await asyncio.sleep(0.1)
        after = await (await client.get("/alerts", headers=auth)).json()
        assert after["counts"] == before["counts"]
    finally:
        manager.close()
