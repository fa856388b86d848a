"""Shared fixtures. The real vLLM stack is started once per test session: on a thread of its own as
the session begins, where a collected test uses it, so that its start (one core's work, 40-70 s on a
2-core host) overlaps the first tests (trace analysis, one core's work too); the e2e tests' two shared
stacks start one after the other behind it (``_shared_stacks``). Where a collected test
reads spans from Arize Phoenix (tests/telemetry), Phoenix starts with the session too and that same
stack exports its spans there: one server start less than a stack of their own (66 s on CI)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
import torch

from background_start import BackgroundStart
from engine_zygote import Zygote
from parallel_server import (ServerChain, data_parallel_start, second_server_start, sglang_start,
                             tensor_parallel_start)
from shared_stacks import fault_stack_builder, fixture_models_builder
from sidecar.cli.client import SidecarClient, SidecarError
from sidecar.cli.make_model import build_model
from sidecar.devtools.stack import Stack
from sidecar.devtools.traffic import LoadResult, run_load
from sidecar_vllm.devtools import VllmStack


# tests/gpu needs a CUDA device: elsewhere it is left out of the collection and the header says so;
# `make test-gpu` (SIDECAR_GPU_TESTS=1) collects it anyway, and fails where there is no device.
GPU_TESTS = torch.cuda.is_available() or os.environ.get("SIDECAR_GPU_TESTS") == "1"
collect_ignore = [] if GPU_TESTS else ["gpu"]


def pytest_report_header(config):
    return None if GPU_TESTS else "tests/gpu not collected: no CUDA device (docs/gpu.md has its last run)"


# Tests that start a server of their own (SGLang; tensor- and data-parallel ranks; two servers on one
# sidecar) run last, where the session's other servers have ended (the shared e2e stacks) or sit idle
# (the session's vLLM stack): each is one to three minutes of server start on 2 cores, which beside
# those servers' work took turns with them for the same cores. Their servers start earlier, in the
# background, while tests that leave a core idle run (``_run_last_servers``).
RUN_LAST = ("sglang", "tensor_parallel", "data_parallel", "multi_server")


# The test at whose start the run-last servers begin to start (``_run_last_servers``).
_RUN_LAST_STARTS_AT = pytest.StashKey[str]()


def _runs_last(item) -> bool:
    return any(item.get_closest_marker(name) for name in RUN_LAST)


# `make test` runs the suite as two pytest processes side by side (scripts/run-tests.sh): the top-level
# files that use none of the session's servers (fake engines and in-process sidecars, mostly waiting for
# heartbeats and steps: one core a third used) in one, everything else in the other. Run one after the
# other, those files were the last five minutes of the run, on one core of two. Each test is in exactly
# one part; `--part all`, the default, is the whole suite in one process.
SHARED_STACKS = ("fixture_models", "fault_stack")
SERVER_FIXTURES = ("vllm_stack", "_vllm_stack_start", "phoenix", *SHARED_STACKS)


def pytest_addoption(parser):
    parser.addoption("--part", choices=("all", "main", "side"), default="all",
                     help="main: every test but the side part's; side: the top-level test files' tests that "
                          "use no session server (scripts/run-tests.sh runs the two side by side)")


def in_side_part(item) -> bool:
    return (item.path.parent == Path(__file__).parent and not _runs_last(item)
            and not any(name in item.fixturenames for name in SERVER_FIXTURES))


def _keep_part(config, items) -> None:
    part = config.getoption("--part")
    if part == "all":
        return
    keep, drop = [], []
    for item in items:
        (keep if in_side_part(item) == (part == "side") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_collection_modifyitems(session, config, items):
    _keep_part(config, items)
    items.sort(key=_runs_last)  # stable: order kept otherwise
    if any(_runs_last(item) for item in items):
        # The first test after the end-to-end ones, which load both cores with real servers' work; the
        # folders after them (probe, service, telemetry, the top level) leave one core mostly idle.
        e2e = [i for i, item in enumerate(items) if not _runs_last(item) and item.path.parent.name == "e2e"]
        config.stash[_RUN_LAST_STARTS_AT] = items[e2e[-1] + 1 if e2e else 0].nodeid


@pytest.fixture(autouse=True)
def _probe_trace_root(tmp_path_factory, monkeypatch):
    """Probes built in a test write under a folder of the test's, never the user's default trace root."""
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(tmp_path_factory.mktemp("probe-traces")))


@pytest.fixture(scope="session")
def engine_zygote():
    """The process the stand-in engines are forked from (tests/engine_zygote.py), started at first use."""
    zygote = Zygote()
    try:
        yield zygote
    finally:
        zygote.close()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("model") / "tiny", size="tiny")


@pytest.fixture(scope="session")
def _run_last_servers(request, tiny_model, tmp_path_factory):
    """The servers of the run-last tests, by marker, on one chain (tests/parallel_server.py), started
    now in the order their tests run. The second vLLM server's probes join the session stack's sidecar
    only when its test opens their relay (tests/e2e/conftest.py ``second_server``). The fixtures of
    tests/e2e/conftest.py close each after its tests, and the session the rest."""
    wanted = _run_last_markers(request.session.items)
    # Looked up here, in the fixture's own setup (the second server's probes read its sidecar's token).
    session_start = request.getfixturevalue("_vllm_stack_start") if "multi_server" in wanted else None
    chain = ServerChain({
        "sglang": lambda after: sglang_start(tiny_model, tmp_path_factory.mktemp("sglang-stack"), after),
        "data_parallel": lambda after: data_parallel_start(tiny_model, tmp_path_factory.mktemp("dp2"), after),
        "tensor_parallel": lambda after: tensor_parallel_start(tiny_model, tmp_path_factory.mktemp("tp2"), after),
        "multi_server": lambda after: second_server_start(tiny_model, tmp_path_factory.mktemp("second"),
                                                          session_start, after),
    })
    try:
        for name in wanted:
            chain.start(name)
        yield chain
    finally:
        chain.close()


def _run_last_markers(items) -> list[str]:
    """The run-last markers of ``items``, in the order of their first test."""
    names: list[str] = []
    for item in items:
        names += [name for name in RUN_LAST if item.get_closest_marker(name) and name not in names]
    return names


@pytest.fixture(autouse=True)
def _start_run_last_servers(request):
    """Begins the run-last servers' starts at the test chosen at collection (``_RUN_LAST_STARTS_AT``),
    or at the first run-last test where that one did not run."""
    if request.node.nodeid == request.config.stash.get(_RUN_LAST_STARTS_AT, None) or _runs_last(request.node):
        request.getfixturevalue("_run_last_servers")


def _collected_use(request, fixture: str) -> bool:
    """Whether a collected test uses ``fixture``, itself or through another fixture."""
    return any(fixture in item.fixturenames for item in request.session.items)


# The session stack's telemetry: pushes and process samples within a second, so that a test reading
# them (tests/telemetry/test_vllm_live.py) waits no longer than that.
SESSION_STACK_ENV = {"SIDECAR_METRICS_PUSH_INTERVAL_MS": "500", "SIDECAR_SAMPLE_INTERVAL_S": "0.5"}


def phoenix_export_env(endpoint: str) -> dict[str, str]:
    """Spans to Phoenix within 0.2 s of their end; metrics only to the sidecar (Phoenix takes traces)."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_METRICS_EXPORTER": "none"}


def _phoenix_installed() -> bool:
    """Where it is not (scripts/install-test-backends.sh), the tests that read Phoenix fail saying so,
    and the session stack, exporting nowhere, still serves every other test."""
    from telemetry.e2e import phoenix_python

    try:
        phoenix_python()
    except AssertionError:
        return False
    return True


@pytest.fixture(scope="session")
def _phoenix_server(tmp_path_factory):
    """Arize Phoenix, started, not yet waited for (tests/telemetry/conftest.py ``phoenix`` waits)."""
    from telemetry.e2e import Phoenix

    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _vllm_stack_start(request, tiny_model, tmp_path_factory):
    env = dict(SESSION_STACK_ENV)
    if _collected_use(request, "phoenix") and _phoenix_installed():  # the endpoint is fixed at the stack's start
        env.update(phoenix_export_env(request.getfixturevalue("_phoenix_server").otlp_http_endpoint))
    start = BackgroundStart(VllmStack(model_dir=tiny_model, work_dir=tmp_path_factory.mktemp("stack"), env=env),
                            name="vllm-stack-start")
    try:
        yield start
    finally:
        start.close()


@pytest.fixture(scope="session")
def _shared_stacks(request, tiny_model, tmp_path_factory):
    """The end-to-end tests' shared stacks (tests/shared_stacks.py), each warming where a collected test
    uses it, one after the other behind the session stack's start: mostly one core's work each, beside
    the trace analysis tests, one core's too (started with the first e2e test, they took turns with
    its servers for both cores)."""
    stacks = {"fixture_models": fixture_models_builder(tmp_path_factory),
              "fault_stack": fault_stack_builder(tiny_model, tmp_path_factory)}
    try:
        after = request.getfixturevalue("_vllm_stack_start") if _collected_use(request, "vllm_stack") else None
        for name, reused in stacks.items():
            if _collected_use(request, name):
                reused.warm(after=after)
                after = reused
        yield stacks
    finally:
        for reused in stacks.values():
            reused.close()


@pytest.fixture(scope="session", autouse=True)
def _early_stacks(request):
    """The session's vLLM stack, then the shared e2e stacks, start with the session where some
    collected test uses them."""
    if _collected_use(request, "vllm_stack"):
        request.getfixturevalue("_vllm_stack_start")
    if any(_collected_use(request, name) for name in SHARED_STACKS):
        request.getfixturevalue("_shared_stacks")


@pytest.fixture(scope="session")
def vllm_stack(_vllm_stack_start):
    """The sidecar and a real multi-process vLLM OpenAI server with the plugin installed."""
    return _vllm_stack_start.result()


# The session stack's jobs and the paths that stop and read each kind.
_JOB_PATHS = (("/profile/stop", "/profile/"), ("/sync/stop", "/sync/"), ("/modules/stop", "/modules/"))


@pytest.fixture(autouse=True)
def _no_job_left_running(request):
    """A test of the session's stack that leaves a capture, scan or module timing running fails at
    its teardown, and the job is stopped there: else every later test of the stack fails with 409
    (CI once failed two tests for one) and the log points at the wrong one."""
    yield
    if "vllm_stack" not in request.fixturenames:
        return
    client = SidecarClient(request.getfixturevalue("vllm_stack").sidecar_url)
    left = []
    for stop, path in _JOB_PATHS:
        try:
            job = client.request("POST", stop)
        except SidecarError:  # 409: none of this kind runs
            continue
        except OSError:  # the sidecar is down: the test that stopped it restores it or fails itself
            return
        left.append(f"{job['id']} ({job['state']})")
        client.wait(job["id"], timeout=60, path=path)
    assert not left, f"the test left {', '.join(left)} running; stopped so that the next test starts clean"


class BackgroundLoad:
    """Streaming clients running in a thread while a test does something else.

    Without ``duration_s`` the load lasts as long as the ``with`` block (at most ``LONGEST_LOAD_S``):
    a test that waits for a capture inside the block keeps the engine stepping however slow the host
    is. A fixed duration raced the machine: CI's 10 s of load ran out before a second capture reached
    its steps, which then waited for steps that never came (an idle engine does not step). Give
    ``duration_s`` only where the test is about a fixed amount of traffic."""

    LONGEST_LOAD_S = 300.0

    def __init__(self, stack: Stack, concurrency: int, duration_s: float | None = None,
                 max_tokens: int = 48) -> None:
        self.result: LoadResult | None = None
        self._stop = threading.Event()
        self._while_block = duration_s is None
        self._thread = threading.Thread(
            target=lambda: setattr(self, "result", asyncio.run(run_load(
                stack.server_url, stack.served_name, concurrency=concurrency,
                duration_s=self.LONGEST_LOAD_S if duration_s is None else duration_s,
                max_tokens=max_tokens, stop=self._stop))),
            daemon=True,
        )

    def stop(self) -> None:
        """End the load early (clients finish the request they are streaming)."""
        self._stop.set()

    def __enter__(self) -> "BackgroundLoad":
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        # A failed test does not keep loading the server; a load without a duration ends with its block.
        if exc_type is not None or self._while_block:
            self._stop.set()
        self._thread.join(timeout=self.LONGEST_LOAD_S)

    def join(self) -> LoadResult:
        self._thread.join(timeout=self.LONGEST_LOAD_S)
        assert self.result is not None, "load generator did not finish"
        return self.result


@pytest.fixture
def background_load():
    return BackgroundLoad
