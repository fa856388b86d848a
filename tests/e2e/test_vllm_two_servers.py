"""Issue 14, engines and instances, on real vLLM: two servers share one sidecar. Each server is one
engine instance (vLLM's own ``instance_id``, the same in its API server, engine core and worker); the
two count their own steps, and one capture records 5 steps of each, each from its own start step.

Two vLLM starts (about a minute each on 2 cores), so not part of ``make test``:
``make test-multi-server`` runs it."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from sidecar import config
from sidecar.client import SidecarClient
from sidecar_vllm.devtools import VllmStack

pytestmark = [pytest.mark.vllm, pytest.mark.multi_server]


@pytest.fixture
def two_servers(tiny_model, tmp_path):
    first = VllmStack(model_dir=tiny_model, work_dir=tmp_path / "first")
    # The second server's probes connect to the first one's sidecar, with its token, writing under
    # its trace dir: one sidecar beside two servers.
    second = VllmStack(model_dir=tiny_model, work_dir=tmp_path / "second", sidecar_port=first.sidecar_port,
                       env={config.ENV_TOKEN_FILE: str(first.work_dir / "token"),
                            config.ENV_TRACE_DIR: str(first.trace_dir)})
    try:
        first.start()
        second.start_server()
        first.wait_for_processes(6, timeout=120)
        yield first, second
    finally:
        second.stop_server()
        first.close()


def test_each_server_records_its_own_steps(two_servers, background_load):
    first, second = two_servers
    client = SidecarClient(first.sidecar_url)
    procs = client.request("GET", "/processes")["processes"]
    by_instance = Counter(p["instance"] for p in procs)
    assert len(by_instance) == 2 and "" not in by_instance and set(by_instance.values()) == {3}, procs

    with background_load(first, concurrency=2, duration_s=60, max_tokens=32) as load_a, \
            background_load(second, concurrency=2, duration_s=60, max_tokens=32) as load_b:
        _wait_until_every_engine_process_steps(client)
        status = client.wait(client.start(5)["id"], timeout=120)
        load_a.stop()
        load_b.stop()
    assert not load_a.join().failures and not load_b.join().failures
    assert status["state"] == "done", status
    assert set(status["start_steps"]) == set(by_instance), status["start_steps"]
    for p in status["processes"]:
        if p["role"] != "api_server":
            assert p["steps_recorded"] == 5 and p["first_step"] == status["start_steps"][p["instance"]], p
    assert status["notes"] == [], status["notes"]


def _wait_until_every_engine_process_steps(client: SidecarClient, steps: int = 10, timeout: float = 120) -> None:
    """Until every step-driven process has stepped ``steps`` times since the load began. The second
    server's /health answers before its worker is through its first batches (on CPU, seconds of work
    that hold the GIL, its probe's link thread silent): a capture started 2 s into the load lost that
    worker ("did not answer 'arm' within 3 s") in 2 runs of 4."""
    def counts() -> dict[int, int]:
        return {p["pid"]: p["last_step"] or 0 for p in client.request("GET", "/processes")["processes"]
                if p["role"] != "api_server"}

    first, deadline = counts(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = counts()
        if all(now.get(pid, 0) - count >= steps for pid, count in first.items()):
            return
        time.sleep(0.5)
    raise AssertionError(f"the engine processes did not step {steps} times within {timeout:g} s: {first} -> {counts()}")
