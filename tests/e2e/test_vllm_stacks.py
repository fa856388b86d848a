"""Issue 15 end to end: Python stacks in a capture of the real vLLM server, by sampling (the API
server's event loop at a capped rate)."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from sidecar.cli.client import SidecarClient
from sidecar.probe.capture.profiler_options import WINDOW_MAX_STACK_HZ

pytestmark = pytest.mark.vllm

TRACK = "python stacks (sampled)"


def capture(vllm_stack, background_load, **params) -> dict:
    client = SidecarClient(vllm_stack.sidecar_url)
    with background_load(vllm_stack, concurrency=4) as load:
        time.sleep(1.5)
        status = client.wait(client.start(5, **params)["id"], timeout=120)
    assert not load.join().failures
    assert status["state"] == "done", status
    return status


def sampled_tracks(client: SidecarClient, status: dict, tmp_path) -> dict[int, list[dict]]:
    """The sampled-stack slices of the merged trace, by pid."""
    trace = json.load(gzip.open(client.download(status["trace"], tmp_path / "trace.json.gz")))
    events = trace["traceEvents"]
    tracks = {(e["pid"], e["tid"]) for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name" and str(e["args"]["name"]).startswith(TRACK)}
    slices: dict[int, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and (e.get("pid"), e.get("tid")) in tracks:
            slices.setdefault(e["pid"], []).append(e)
    return slices


def test_sampled_stacks_from_the_engine_core_and_the_worker(vllm_stack, background_load, tmp_path):
    status = capture(vllm_stack, background_load, stacks="sampled")
    client = SidecarClient(vllm_stack.sidecar_url)
    by_role = {p["role"]: p for p in status["processes"]}
    assert {role: p["stacks"] for role, p in by_role.items()} == {
        "api_server": "sampled", "engine_core": "sampled", "worker": "sampled"}
    assert status["options"]["stacks"] == "sampled" and status["options"]["stack_hz"] == 1000.0
    slices = sampled_tracks(client, status, tmp_path)
    for role in ("engine_core", "worker"):
        p = by_role[role]
        assert p["stack_summary"]["samples"] > 0 and p["stack_summary"]["stop_reason"] is None, p
        frames = slices.get(p["pid"], [])
        assert frames, f"no sampled frames from the {role}"
        assert all(e["cat"] == "python_function" for e in frames)
        # vLLM's own Python, by file: the engine core's busy loop, the worker's model runner.
        files = {e["args"]["file"] for e in frames}
        assert any("/vllm/" in f for f in files), sorted(files)[:20]
    # The API server's event loop is sampled too, at its capped rate (each sample makes the loop
    # hand over the GIL: sidecar/probe/capture/profiler.py), and says so in its summary.
    api = by_role["api_server"]
    assert api["stack_summary"]["samples"] > 0 and api["stack_summary"]["target_hz"] == WINDOW_MAX_STACK_HZ, api
    api_files = {e["args"]["file"] for e in slices.get(api["pid"], [])}
    # The loop's own frames: vLLM runs it under uvloop (a C loop, so asyncio's base_events.py shows only
    # in the samples that catch a Python callback of it), entered through asyncio's Runner either way.
    loop_files = ("asyncio/runners.py", "asyncio/base_events.py", "uvloop/__init__.py")
    assert any(f.endswith(loop_files) for f in api_files), sorted(api_files)[:20]
    core_files = {e["args"]["file"] for e in slices[by_role["engine_core"]["pid"]]}
    assert any(f.endswith("vllm/v1/engine/core.py") for f in core_files)
    # The summary names the hottest line, and the headline says it (built by the sidecar from each
    # probe's raw samples file, which goes with the raw folder).
    summary = client.summary(status["id"])
    assert set(summary["python_stacks"]) >= {by_role["engine_core"]["label"], by_role["worker"]["label"]}
    assert all(summary["python_stacks"][by_role[r]["label"]]["top_self"] for r in ("engine_core", "worker"))
    assert "python: " in status["headline"]
    assert not [n for n in status["notes"] if "python stacks" in n], status["notes"]
    leftovers = [p for p in (vllm_stack.trace_dir / "captures" / status["id"]).rglob("*") if p.name.endswith(".stacks.msgpack")]
    assert leftovers == []


def test_traced_stacks_only_in_the_worker(vllm_stack, background_load, tmp_path):
    """torch's tracer is never applied to the engine core (13 s stall, issue 15): it samples."""
    status = capture(vllm_stack, background_load, stacks="traced", processes="engine_core,worker")
    by_role = {p["role"]: p for p in status["processes"]}
    assert by_role["worker"]["stacks"] == "traced" and by_role["worker"]["stack_summary"] is None
    assert by_role["engine_core"]["stacks"] == "sampled" and by_role["engine_core"]["stack_summary"]["samples"] > 0
