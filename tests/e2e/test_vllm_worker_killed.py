"""Issue 10 fault injection on real vLLM: a worker killed in the middle of a capture.

vLLM cannot serve without its worker (the engine core and the API server go down with it), so no
process can hand over a trace: the truthful verdict is ``failed``, reached within seconds (not at the
capture's timeout), naming every process as lost, the worker among them. Not the session's
``vllm_stack``, which must stay up: the fixture-model server (conftest.py), once the tests of its
models are done with it (its models play no part here)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from sidecar.cli.client import SidecarClient

pytestmark = pytest.mark.vllm


def test_a_worker_killed_mid_capture_gives_a_prompt_truthful_verdict(fixture_models, background_load):
    with fixture_models.use_up() as stack:
        client = SidecarClient(stack.sidecar_url)
        worker = next(p for p in client.request("GET", "/processes")["processes"] if p["role"] == "worker")
        with background_load(stack, concurrency=4) as load:
            time.sleep(1.5)
            capture_id = client.start(400, timeout_s=300)["id"]
            deadline = time.monotonic() + 30
            while client.status(capture_id)["state"] != "capturing":
                assert time.monotonic() < deadline, "the capture never started recording"
                time.sleep(0.05)
            os.kill(worker["pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            status = client.wait(capture_id, timeout=60)
            took = time.monotonic() - killed_at
            load.stop()  # the server is gone: its clients only fail from here on
        assert took < 30, f"verdict {took:.1f} s after the kill: it waited for a timeout"
        assert status["state"] == "failed" and status["trace"] is None, status
        by_role = {p["role"]: p for p in status["processes"]}
        assert by_role["worker"]["state"] == "lost" and "disconnected" in by_role["worker"]["error"]
        assert by_role["worker"]["label"] in status["reason"]
        # The sidecar itself is unharmed: it answers, and lists no process of the dead engine.
        assert client.request("GET", "/processes")["processes"] == []
