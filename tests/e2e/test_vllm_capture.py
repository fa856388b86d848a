"""Issue 2 end to end: the real multi-process vLLM OpenAI server with the plugin, and the sidecar."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter

import pytest

from sidecar.cli.client import SidecarClient, SidecarError

pytestmark = pytest.mark.vllm


def merged_events(client: SidecarClient, status: dict, tmp_path) -> tuple[list[dict], dict]:
    path = client.download(status["trace"], tmp_path / "trace.json.gz")
    trace = json.load(gzip.open(path))
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    return events, names


def test_five_step_capture_records_every_process(vllm_stack, background_load, tmp_path):
    client = SidecarClient(vllm_stack.sidecar_url)
    with background_load(vllm_stack, concurrency=4) as load:
        time.sleep(1.5)
        started = client.start(5)
        assert started["state"] in ("armed", "capturing")
        status = client.wait(started["id"], timeout=120)
    assert not load.join().failures
    assert status["state"] == "done", status
    roles = Counter(p["role"] for p in status["processes"])
    assert roles == {"api_server": 1, "engine_core": 1, "worker": 1}
    # One server, one engine instance: vLLM's own id of it, the same in every process (issue 14).
    instances = {p["instance"] for p in client.request("GET", "/processes")["processes"]}
    assert len(instances) == 1 and instances != {""}, instances

    events, names = merged_events(client, status, tmp_path)
    by_role = {p["role"]: p for p in status["processes"]}
    worker, core = by_role["worker"], by_role["engine_core"]
    # The same engine steps in every process: one start step, reached by both.
    assert worker["first_step"] == core["first_step"] == status["start_step"], status
    assert status["notes"] == []
    worker_steps = sorted(e["name"] for e in events if e.get("pid") == worker["pid"] and e.get("name", "").startswith("ProfilerStep#"))
    assert worker_steps == [f"ProfilerStep#{i}" for i in range(5)]
    core_steps = [e for e in events if e.get("pid") == core["pid"] and e.get("name", "").startswith("ProfilerStep#")]
    assert len(core_steps) == 5
    assert any(e.get("cat") == "cpu_op" and e.get("pid") == worker["pid"] for e in events)
    assert names[worker["pid"]] == worker["label"] and "worker rank 0" in worker["label"]
    assert names[core["pid"]] == core["label"] and "engine core" in core["label"]

    # One timeline: each worker step runs inside the engine core step that scheduled it and waits for
    # it (2 ms of slack for the clocks' rounding).
    w = sorted((e for e in events if e.get("pid") == worker["pid"] and e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
    c = sorted(core_steps, key=lambda e: e["ts"])
    for ws, cs in zip(w, c):
        assert cs["ts"] - 2_000 <= ws["ts"] <= cs["ts"] + cs["dur"] + 2_000, (ws, cs)

    # Issue 5: the capture analysed itself, one summary entry per captured step per worker.
    summary = client.summary(status["id"])
    worker_entries = [s for s in summary["steps"] if "worker" in str(s["process"])]
    assert sorted(s["step"] for s in worker_entries) == [0, 1, 2, 3, 4]
    assert status["headline"]


def test_second_and_third_captures_on_the_same_server(vllm_stack, background_load, tmp_path):
    client = SidecarClient(vllm_stack.sidecar_url)
    with background_load(vllm_stack, concurrency=2) as load:
        time.sleep(1)
        first = client.wait(client.start(3, processes="worker")["id"], timeout=60)
        second = client.wait(client.start(2, delay=2, record_shapes=True)["id"], timeout=60)
    assert not load.join().failures
    assert first["state"] == "done" and [p["role"] for p in first["processes"]] == ["worker"]
    assert second["state"] == "done" and {p["steps_recorded"] for p in second["processes"] if p["role"] != "api_server"} == {2}
    events, _ = merged_events(client, second, tmp_path)
    assert any("Input Dims" in e.get("args", {}) for e in events if e.get("cat") == "cpu_op"), "record_shapes was honoured"
    # With shapes each step is a profiler session of its own, joined into one trace per process
    # (sidecar/probe/capture/trace_parts.py): both steps there once, and the worker's forward ops with their
    # shapes in each (the engine core's few ops need not have tensor inputs in every step).
    for proc in (p for p in second["processes"] if p["role"] != "api_server"):
        steps = sorted((e for e in events if e.get("pid") == proc["pid"] and e.get("name", "").startswith("ProfilerStep#")),
                       key=lambda e: e["ts"])
        assert [e["name"] for e in steps] == ["ProfilerStep#0", "ProfilerStep#1"], (proc["label"], steps)
        for step in steps if proc["role"] == "worker" else ():
            shaped = [e for e in events if e.get("pid") == proc["pid"] and e.get("cat") == "cpu_op"
                      and step["ts"] <= e["ts"] <= step["ts"] + step["dur"] and "Input Dims" in e.get("args", {})]
            assert shaped, (proc["label"], step["name"])


@pytest.mark.parametrize("params, name", [
    ({"steps": "0"}, "steps"), ({"steps": "-3"}, "steps"), ({"steps": "abc"}, "steps"),
    ({"steps": "1000000000"}, "steps"), ({"steps": "5", "activities": "tpu"}, "activities"),
])
def test_bad_parameters_are_400_with_json(vllm_stack, params, name):
    client = SidecarClient(vllm_stack.sidecar_url)
    with pytest.raises(SidecarError) as info:
        client.request("GET", "/profile/start", params)
    assert info.value.status == 400
    assert info.value.body["param"] == name and info.value.body["error"] == "bad_parameter"


def test_start_during_a_capture_is_409(vllm_stack):
    client = SidecarClient(vllm_stack.sidecar_url)
    # No traffic: the capture stays armed, waiting for a working step.
    capture_id = client.start(5, timeout_s=60)["id"]
    try:
        with pytest.raises(SidecarError) as info:
            client.start(1)
        assert info.value.status == 409 and info.value.body["active"] == capture_id
    finally:
        client.request("POST", "/profile/stop")
    status = client.wait(capture_id, timeout=30)
    # Stopped by its user before any engine step: cancelled, with nothing to download (issue 10).
    assert status["state"] == "cancelled" and status["reason"] == "cancelled by the user before any step was recorded"
    assert status["trace"] is None and status["files"] == {}


def test_sidecar_killed_and_restarted_while_streaming(vllm_stack, background_load):
    # The load runs until the capture is over: an engine that goes idle mid-capture cannot stop
    # torch.profiler (it stops on the engine's own step), and this test is not about that.
    with background_load(vllm_stack, concurrency=8) as load:
        time.sleep(2)
        vllm_stack.stop_sidecar(kill=True)
        time.sleep(3)
        vllm_stack.start_sidecar()
        vllm_stack.wait_for_processes(3, timeout=30)
        client = SidecarClient(vllm_stack.sidecar_url)
        status = client.wait(client.start(3)["id"], timeout=60)
    result = load.join()
    assert status["state"] == "done", status
    assert len(result.results) > 8 and not result.failures, [r.error for r in result.failures][:3]
