"""Issue 4 end to end: the planted syncs on the real multi-process vLLM server, scanned through the
sidecar's /sync endpoints, with SIDECAR_SYNC_TREAT_CPU_AS_DEVICE=1 (no GPU here, so no real syncs).

The server is the session's fixture-model server (conftest.py ``fixture_models``): the planted
model with the slow-token triggers, whose two checks are syncs of their own, reported as well."""

from __future__ import annotations

import time

import pytest

from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.vllm
STEPS = 3


@pytest.fixture
def planted_stack(slow_token_stack):
    return slow_token_stack


def wait_scan(client: SidecarClient, scan_id: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.request("GET", f"/sync/{scan_id}")
        if body["state"] in ("done", "partial", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_scan_reports_exactly_the_planted_lines(planted_stack, background_load):
    from planted_sync_model.model import PLANTED_FILE, PLANTED_SYNCS
    from slow_token_model.model import SLEEP_FILE, TRIGGER_SYNCS

    client = SidecarClient(planted_stack.sidecar_url)
    with background_load(planted_stack, concurrency=2) as load:
        time.sleep(1)
        started = client.request("POST", "/sync/start", {"steps": STEPS})
        result = wait_scan(client, started["id"])
    assert not load.join().failures, "a scan must never fail a request"
    assert result["state"] == "done", result
    assert result["treat_cpu_as_device"] is True
    assert {p["role"] for p in result["processes"]} == {"engine_core", "worker"}
    sites = result["sites"]

    hidden = [s for s in sites if s["classification"] == "hidden"]
    planted = [s for s in hidden if s["file"] == PLANTED_FILE]
    triggers = [s for s in hidden if s["file"] == SLEEP_FILE]
    assert sorted((s["line"], s["op"]) for s in planted) == sorted(PLANTED_SYNCS)
    assert sorted((s["line"], s["op"]) for s in triggers) == sorted(TRIGGER_SYNCS) and len(TRIGGER_SYNCS) == 2
    assert len(hidden) == len(planted) + len(triggers), [(s["file"], s["line"]) for s in hidden]
    for s in hidden:
        assert s["function"] == ("planted_syncs" if s in planted else "forward") and s["phase"] == "forward"
        assert s["count"] == STEPS and s["count_per_step"] == 1.0
        assert s["processes"] == [p["label"] for p in result["processes"] if p["role"] == "worker"]

    expected = [s for s in sites if s["classification"] == "expected"]
    assert ("vllm/v1/worker/cpu_model_runner.py", "_to_list", "tolist") in [(s["path"], s["function"], s["op"]) for s in expected]
    assert all(s["path"].startswith("vllm/") for s in expected)
    assert not [s for s in sites if s["path"].startswith(("sidecar/", "sidecar_vllm/", "plugins/")) or "/sidecar/" in s["file"]]
    assert result["hidden"] == len(PLANTED_SYNCS) + len(TRIGGER_SYNCS)
