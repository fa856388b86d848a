"""Issue 13, part 1 end to end: a capture of the real multi-process vLLM server records each process's
phase ranges, and its summary shows the time of each phase per engine step in each process."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.vllm


def test_a_five_step_capture_shows_each_process_s_phases(vllm_stack, background_load, tmp_path):
    client = SidecarClient(vllm_stack.sidecar_url)
    with background_load(vllm_stack, concurrency=4) as load:
        time.sleep(1.5)
        status = client.wait(client.start(5)["id"], timeout=120)
    assert not load.join().failures
    assert status["state"] == "done", status
    by_role = {p["role"]: p for p in status["processes"]}

    anatomy = client.summary(status["id"])["anatomy"]
    assert anatomy is not None
    rows = {p["pid"]: p for p in anatomy["processes"]}
    core, worker = rows[by_role["engine_core"]["pid"]], rows[by_role["worker"]["pid"]]
    assert len(core["steps"]) == len(worker["steps"]) == 5
    assert core["complete_steps"] >= 4 and worker["complete_steps"] >= 4
    for step in (s for s in core["steps"] if not s["partial"]):
        assert step["phases_us"]["schedule"] > 0 and step["phases_us"]["update"] > 0
        assert step["phases_us"]["wait_model"] > 0 and step["phases_us"]["dispatch"] > 0
    for step in (s for s in worker["steps"] if not s["partial"]):
        assert all(step["phases_us"][p] > 0 for p in ("prepare", "forward", "sample")), step
    # the engine core waits for the worker's forward and sampling: its wait holds them
    assert core["mean_us"]["wait_model"] > worker["mean_us"]["forward"]
    # the API server turned the engine's outputs into responses while the engine stepped
    api = rows[by_role["api_server"]["pid"]]
    assert api["steps_of"] == by_role["engine_core"]["label"] and api["total_us"]["output"] > 0
    (between,) = [b for b in anatomy["between_forwards"] if b["pid"] == by_role["worker"]["pid"]]
    assert between["mean_host_us"] > 0 and between["mean_device_idle_us"] is None  # a CPU host
    assert anatomy["largest"] is not None and anatomy["largest"]["phase"] != "wait_model"
    assert f"largest phase {anatomy['largest']['label']}" in status["headline"]

    # The merged trace holds the named ranges, in the processes that record them, and says which are phases.
    trace = json.load(gzip.open(client.download(status["trace"], tmp_path / "trace.json.gz")))
    table = trace["inference_sidecar"]["phase_ranges"]
    assert table["sidecar: schedule"] == "schedule" and table["gpu_model_runner: forward"] == "forward"
    ranges: dict[int, set[str]] = {}
    for e in trace["traceEvents"]:
        if e.get("cat") == "user_annotation" and e.get("name") in table:
            ranges.setdefault(e["pid"], set()).add(e["name"])
    assert {"sidecar: schedule", "sidecar: send to workers", "sidecar: wait for model",
            "sidecar: update from output"} <= ranges[by_role["engine_core"]["pid"]]
    assert {"gpu_model_runner: preprocess", "gpu_model_runner: forward",
            "gpu_model_runner: sample"} <= ranges[by_role["worker"]["pid"]]
    assert "sidecar: process outputs" in ranges[by_role["api_server"]["pid"]]
