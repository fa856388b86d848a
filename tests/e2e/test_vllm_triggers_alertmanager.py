"""Issue 30 on the real thing: real vLLM serving the slow-token fixture model, real Prometheus
evaluating the project's alert rules (deploy/alerts.yml, the TTFT alert's ``for:`` made 2 s, every
rule evaluated each second), real Alertmanager routing as deploy/alertmanager.yml does to the
sidecar's ``POST /alerts``. Slow prompts (each a 1.5 s prefill step) raise p95 time to first token
over the rule's 2 s: the rule fires, Alertmanager posts, the sidecar's action (tests/alert_chain.py
``E2E_ALERT_ACTIONS``, its ``--alert-actions`` in tests/shared_stacks.py) starts a capture, which ends
done naming the alert. Printed: the time from the alert's ``startsAt`` to the capture armed.

The shared stack's sidecar has no token (loopback); Alertmanager presenting one, and a wrong one
refused, is tests/service/test_alerts_alertmanager.py's."""

from __future__ import annotations

import json
import time

import pytest
from completions import complete

from alert_chain import E2E_ALERT, Alertmanager, RulesPrometheus, alertmanager_config, rules_with_short_for
from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.vllm
FIRE_TIMEOUT_S = 240  # slow prompts until the alert has fired and reached the sidecar: about 30 s here


def _get(stack, path: str) -> dict:
    return json.loads(SidecarClient(stack.sidecar_url, timeout=30).call("GET", path))


def run_alert_chain(stack, work_dir, salt: int = 0) -> tuple[dict, dict]:
    """Raise the TTFT alert on ``stack`` through real Prometheus and Alertmanager: (the firing as GET
    /alerts lists it, its capture once final). Shared with benchmarks/bench_alert_chain.py."""
    from slow_token_model import SLOW_TOKEN_ID, prompt_ids

    manager = Alertmanager(work_dir / "alertmanager", alertmanager_config(f"{stack.sidecar_url}/alerts", None))
    prometheus = None
    try:
        prometheus = RulesPrometheus(work_dir / "prometheus", f"127.0.0.1:{stack.sidecar_port}",
                                     rules_with_short_for(E2E_ALERT, "2s"), manager)
        seen = {f["id"] for f in _get(stack, "/alerts")["firings"]}
        deadline, i, firing = time.monotonic() + FIRE_TIMEOUT_S, 0, None
        while firing is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"no firing of {E2E_ALERT} after {FIRE_TIMEOUT_S} s: Prometheus has "
                                     f"{prometheus.alerts()}, the sidecar {_get(stack, '/alerts')}")
            complete(stack, prompt_ids(SLOW_TOKEN_ID, salt=salt + i), max_tokens=2)  # one 1.5 s step each
            i += 1
            firing = next((f for f in _get(stack, "/alerts")["firings"] if f["id"] not in seen), None)
        deadline = time.monotonic() + 60
        while firing["capture"] is None and firing["capture_skipped"] is None:  # armed on a task of its own
            assert time.monotonic() < deadline, firing
            time.sleep(0.05)
            firing = next(f for f in _get(stack, "/alerts")["firings"] if f["id"] == firing["id"])
    finally:
        if prometheus is not None:
            prometheus.close()
        manager.close()
    assert firing["capture"], firing
    deadline = time.monotonic() + 120  # the capture needs steps: normal requests give them
    while True:
        capture = _get(stack, f"/profile/{firing['capture']}")
        if capture["state"] not in ("armed", "capturing", "exporting") or time.monotonic() > deadline:
            break
        complete(stack, [11, 12, 13, 14], max_tokens=8)
    firing = next(f for f in _get(stack, "/alerts")["firings"] if f["id"] == firing["id"])
    return firing, capture


def test_an_alert_rule_captures_the_engine_through_alertmanager(slow_token_stack, tmp_path):
    stack = slow_token_stack
    firing, capture = run_alert_chain(stack, tmp_path)
    alert = firing["alert"]
    assert alert["name"] == E2E_ALERT and alert["labels"]["instance"] == f"127.0.0.1:{stack.sidecar_port}"
    assert alert["labels"]["severity"] == "warning" and alert["labels"]["gen_ai_request_model"] == stack.served_name
    assert capture["state"] == "done", capture
    assert capture["alert"] == {**alert, "firing": firing["id"]} and capture["trigger"] is None
    assert firing["recorder"] and firing["recorder_error"] is None
    assert 0 < firing["arm_latency_ms"] < firing["start_to_armed_ms"], firing
    print(f"\n{E2E_ALERT}: alert startsAt -> capture armed {firing['start_to_armed_ms']:.0f} ms "
          f"(the sidecar's own part {firing['arm_latency_ms']:.1f} ms); capture {capture['id']} {capture['state']}")
