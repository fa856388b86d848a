"""A deleted trigger takes its series off /metrics (issue 27, item 5): each trigger labels
``sidecar_trigger_firings_total`` with its id, and a client that adds and deletes triggers in a loop
must not grow the sidecar's registry (and every scrape) without bound."""

import re

from test_service import sidecar  # noqa: F401 (a fixture)

RULE = {"metric": "step_duration", "threshold_ms": 500, "cooldown_s": 60}
ROUNDS = 300


def trigger_ids_on_metrics(text: str) -> set[str]:
    """The trigger ids that label a ``sidecar_trigger_firings`` sample (_total and _created alike)."""
    return set(re.findall(r'^sidecar_trigger_firings_\w+\{[^}]*trigger="([^"]+)"', text, re.M))


async def test_deleted_triggers_leave_no_series_on_metrics(sidecar):
    client = await sidecar()
    kept = await (await client.post("/triggers", json=RULE)).json()
    for _ in range(ROUNDS):
        resp = await client.post("/triggers", json=RULE)
        assert resp.status == 201, await resp.text()
        trigger_id = (await resp.json())["id"]
        assert (await client.delete(f"/triggers/{trigger_id}")).status == 200
    text = await (await client.get("/metrics")).text()
    assert trigger_ids_on_metrics(text) == {kept["id"]}
    # The live trigger's two outcomes are still there, from 0.
    for outcome in ("fired", "skipped"):
        assert f'sidecar_trigger_firings_total{{outcome="{outcome}",trigger="{kept["id"]}"}} 0.0' in text
    assert (await client.delete(f"/triggers/{kept['id']}")).status == 200
    assert trigger_ids_on_metrics(await (await client.get("/metrics")).text()) == set()
