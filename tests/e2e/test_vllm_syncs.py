"""Issue 4 end to end: the planted model on the real multi-process vLLM server, scanned through the
sidecar's /sync endpoints, with SIDECAR_SYNC_TREAT_CPU_AS_DEVICE=1 (no GPU here, so no real syncs)."""

from __future__ import annotations

import time

import pytest

from sidecar.client import SidecarClient
from sidecar_vllm.devtools import VllmStack

pytestmark = pytest.mark.vllm
STEPS = 3


@pytest.fixture(scope="module")
def planted_stack(tmp_path_factory):
    from planted_sync_model import make_model_dir

    model = make_model_dir(tmp_path_factory.mktemp("planted") / "model")
    stack = VllmStack(model_dir=model, work_dir=tmp_path_factory.mktemp("planted-stack"),
                  env={"SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1"})
    try:
        yield stack.start()
    finally:
        stack.close()


def wait_scan(client: SidecarClient, scan_id: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = client.request("GET", f"/sync/{scan_id}")
        if body["state"] in ("done", "partial", "failed") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_scan_reports_exactly_the_planted_lines(planted_stack, background_load):
    from planted_sync_model.model import PLANTED_FILE, PLANTED_SYNCS

    client = SidecarClient(planted_stack.sidecar_url)
    with background_load(planted_stack, concurrency=2, duration_s=8) as load:
        time.sleep(1)
        started = client.request("POST", "/sync/start", {"steps": STEPS})
        result = wait_scan(client, started["id"])
    assert not load.join().failures, "a scan must never fail a request"
    assert result["state"] == "done", result
    assert result["treat_cpu_as_device"] is True
    assert {p["role"] for p in result["processes"]} == {"engine_core", "worker"}
    sites = result["sites"]

    hidden = [s for s in sites if s["classification"] == "hidden"]
    assert sorted((s["line"], s["op"]) for s in hidden) == sorted(PLANTED_SYNCS)
    for s in hidden:
        assert s["file"] == PLANTED_FILE and s["function"] == "planted_syncs" and s["phase"] == "forward"
        assert s["count"] == STEPS and s["count_per_step"] == 1.0
        assert s["processes"] == [p["label"] for p in result["processes"] if p["role"] == "worker"]

    expected = [s for s in sites if s["classification"] == "expected"]
    assert ("vllm/v1/worker/cpu_model_runner.py", "_to_list", "tolist") in [(s["path"], s["function"], s["op"]) for s in expected]
    assert all(s["path"].startswith("vllm/") for s in expected)
    assert not [s for s in sites if s["path"].startswith(("sidecar/", "sidecar_vllm/", "plugins/")) or "/sidecar/" in s["file"]]
    assert result["hidden"] == len(PLANTED_SYNCS)
