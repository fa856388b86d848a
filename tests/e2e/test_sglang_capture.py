"""Issue 12 end to end: the real multi-process SGLang server (CPU, from .venv/sglang/) with the plugin
loaded through SGLang's own ``sglang.srt.plugins`` entry point, and the sidecar beside it."""

from __future__ import annotations

import gzip
import json
import time
from collections import Counter

import pytest

from sidecar.client import SidecarClient
from sidecar_sglang.devtools import SglangStack, sglang_python

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="session")
def sglang_stack(tiny_model, tmp_path_factory):
    """The sidecar and a real SGLang server (HTTP server, one scheduler, detokenizer) with the plugin."""
    try:
        python = sglang_python()
    except FileNotFoundError as exc:  # a missing venv is a broken setup, not a reason to skip
        pytest.fail(str(exc), pytrace=False)
    stack = SglangStack(model_dir=tiny_model, work_dir=tmp_path_factory.mktemp("sglang-stack"), python=python)
    try:
        yield stack.start()
    finally:
        stack.close()


def test_three_step_capture_records_scheduler_and_http_server(sglang_stack, background_load, tmp_path):
    client = SidecarClient(sglang_stack.sidecar_url)
    procs = {p["role"]: p for p in client.request("GET", "/processes")["processes"]}
    assert set(procs) == {"api_server", "scheduler"}, procs
    assert procs["scheduler"]["engine"].startswith("sglang"), procs["scheduler"]

    with background_load(sglang_stack, concurrency=2, duration_s=60, max_tokens=32) as load:
        time.sleep(1.5)
        started = client.start(3)
        status = client.wait(started["id"], timeout=120)
        load.stop()
    result = load.join()
    assert result.results and not result.failures, [r.error for r in result.failures][:3]
    assert status["state"] == "done", status
    roles = Counter(p["role"] for p in status["processes"])
    assert roles == {"api_server": 1, "scheduler": 1}, status["processes"]
    by_role = {p["role"]: p for p in status["processes"]}
    scheduler, server = by_role["scheduler"], by_role["api_server"]
    assert scheduler["steps_recorded"] == 3 and scheduler["first_step"] == status["start_step"], status

    trace = json.load(gzip.open(client.download(status["trace"], tmp_path / "trace.json.gz")))
    events = trace["traceEvents"]
    steps = sorted(e["name"] for e in events if e.get("pid") == scheduler["pid"] and e.get("name", "").startswith("ProfilerStep#"))
    assert steps == [f"ProfilerStep#{i}" for i in range(3)], steps
    # The scheduler process runs the model: its ops are in the trace.
    assert any(e.get("cat") == "cpu_op" and e.get("pid") == scheduler["pid"] for e in events)
    # The HTTP server recorded the capture's window, on its event loop.
    assert any(e.get("pid") == server["pid"] and e.get("ph") == "X" for e in events), "no events from the HTTP server"
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert "scheduler" in names[scheduler["pid"]]
