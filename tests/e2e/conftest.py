"""Servers the end-to-end tests share beyond the session's plain ``vllm_stack`` (tests/conftest.py).
A vLLM server start costs 40-70 s on a 2-core host, so each of these is started once and used by
several test files in turn, the last of which ends it (``fault_tools.ReusedStack``: a test that finds
the stack ended, run alone or in another order, gets a fresh one). Files run in name order:

- ``fixture_models``: test_vllm_incidents.py, test_vllm_slow_token_fixture.py, test_vllm_syncs.py,
  test_vllm_triggers.py, then test_vllm_worker_killed.py kills its worker.
- ``fault_stack``: test_vllm_disk_full.py, test_vllm_faults.py (the trace backend outage), then
  test_vllm_shutdown.py SIGTERMs its sidecar and its server.

The tests that run last (tests/conftest.py, ``RUN_LAST``) have servers of their own, started one after
the other from the first test after this folder's (tests/conftest.py ``_run_last_servers``,
tests/parallel_server.py); the fixtures below hand each to its test and close it after.

Both start together as the first test of tests/e2e begins (each where a collected test needs it;
``_warm_shared_stacks``), on threads of their own: a start is mostly one core's work, so they overlap
the e2e tests before them (the example server, SGLang, the session stack's captures), which leave a
core idle much of the time. Warmed only when asked for, they cost the disk test's setup 87 s on CI.
"""

from __future__ import annotations

import pytest

from background_start import ENVIRON_AT_START
from fault_tools import SMALL_DISK_FLOOR_MB, SMALL_DISK_MB, ReusedStack, SmallDisk
from sidecar.devtools.stack import free_port
from sidecar_vllm.devtools import VllmStack


def fixture_models_builder(tmp_path_factory) -> ReusedStack:
    """The sidecar and real vLLM serving the fixture models in one (tests/fixtures/slow_token_model,
    ``planted=True``): a prompt ending in SLOW_TOKEN_ID makes one 1.5 s step; HANG_TOKEN_ID hangs a step
    until the file ``env[ENV_HANG_RELEASE]`` exists (60 s at most); every forward makes the planted
    syncs, which a sync scan counts (SIDECAR_SYNC_TREAT_CPU_AS_DEVICE=1); the step watchdog is at 3 s."""
    from slow_token_model import ENV_HANG_RELEASE, ENV_HANG_S, make_model_dir

    def make(resources):
        work = tmp_path_factory.mktemp("fixture-models")
        model = make_model_dir(work / "model", planted=True)
        return VllmStack(model_dir=model, work_dir=work / "stack", base_env=ENVIRON_AT_START, env={
            "SIDECAR_WATCHDOG_S": "3",
            "SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1",
            ENV_HANG_RELEASE: str(work / "release-hang"),
            ENV_HANG_S: "60",  # released early: the bound only has to outlast a slow host's examination
        })

    return ReusedStack(make)


def fault_stack_builder(tiny_model, tmp_path_factory) -> ReusedStack:
    """vLLM and the sidecar with two faults in waiting. The trace dir, ``stack.disk.folder``, is a tmpfs
    of SMALL_DISK_MB in a user and mount namespace of their own (``SmallDisk``; the sidecar's free-space
    floor SMALL_DISK_FLOOR_MB): it fills when a test fills it. The OTLP endpoint (traces and metrics)
    is ``stack.dead_port``, where nothing listens unless a test puts a backend there: every export is
    refused, retried for up to 10 s (the exporters' default timeout), dropped. Spans leave the queue
    after 0.2 s, and the queue holds 16 (the default 2048 would take minutes of load to fill; 64 did
    not fill on a slow CI runner, whose load made fewer spans than three exports dropped);
    metrics are pushed to the sidecar every second."""
    def make(resources):
        work = tmp_path_factory.mktemp("fault-stack")
        disk = SmallDisk(work / "traces", SMALL_DISK_MB)
        resources.callback(disk.close)
        port = free_port()
        stack = VllmStack(model_dir=tiny_model, work_dir=work / "stack", launcher=disk.launcher,
                          base_env=ENVIRON_AT_START,
                          sidecar_args=("--min-free-mb", str(SMALL_DISK_FLOOR_MB)), env={
                              "SIDECAR_TRACE_DIR": str(disk.folder),
                              "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                              "OTEL_BSP_SCHEDULE_DELAY": "200",
                              "OTEL_BSP_MAX_QUEUE_SIZE": "16",
                              "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "16",  # the SDK's processor (the sidecar's spans) refuses more
                              "SIDECAR_METRICS_PUSH_INTERVAL_MS": "1000",
                          })
        stack.disk, stack.dead_port = disk, port
        return stack

    return ReusedStack(make)


@pytest.fixture(scope="session")
def _shared_stacks(request, tiny_model, tmp_path_factory):
    """Both stacks, each warming if a collected test uses it."""
    stacks = {"fixture_models": fixture_models_builder(tmp_path_factory),
              "fault_stack": fault_stack_builder(tiny_model, tmp_path_factory)}
    try:
        for name, reused in stacks.items():
            if any(name in item.fixturenames for item in request.session.items):
                reused.warm()
        yield stacks
    finally:
        for reused in stacks.values():
            reused.close()


@pytest.fixture(scope="session", autouse=True)
def _warm_shared_stacks(request):
    """The shared stacks start with the first test of tests/e2e, not with the first that uses one."""
    if any(name in item.fixturenames for item in request.session.items for name in ("fixture_models", "fault_stack")):
        request.getfixturevalue("_shared_stacks")


@pytest.fixture(scope="session")
def fixture_models(_shared_stacks) -> ReusedStack:
    return _shared_stacks["fixture_models"]


@pytest.fixture(scope="session")
def fault_stack(_shared_stacks) -> ReusedStack:
    return _shared_stacks["fault_stack"]


@pytest.fixture
def slow_token_stack(fixture_models):
    """The fixture-model server, serving."""
    return fixture_models.use()


def _used_then_closed(start):
    """The started server for one test, closed after it: the next run-last test gets the cores."""
    try:
        yield start.result()
    finally:
        start.close()


@pytest.fixture
def tp2_server(_run_last_servers):
    """Real vLLM with ``--tensor-parallel-size 2``, every engine process connected to its sidecar."""
    yield from _used_then_closed(_run_last_servers["tensor_parallel"])


@pytest.fixture
def dp2_server(_run_last_servers):
    """Real vLLM with ``--data-parallel-size 2``, every engine process connected to its sidecar."""
    yield from _used_then_closed(_run_last_servers["data_parallel"])


@pytest.fixture
def second_server(_run_last_servers):
    """A second real vLLM server whose probes connect to the session stack's sidecar."""
    yield from _used_then_closed(_run_last_servers["multi_server"])
