"""Shared fixtures. The real vLLM stack is started once per test session, on first use."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
import torch

from sidecar.devtools.local_model import build_model
from sidecar.devtools.stack import Stack
from sidecar.devtools.traffic import LoadResult, run_load
from sidecar_vllm.devtools import VllmStack


# tests/gpu needs a CUDA device: elsewhere it is left out of the collection and the header says so;
# `make test-gpu` (SIDECAR_GPU_TESTS=1) collects it anyway, and fails where there is no device.
GPU_TESTS = torch.cuda.is_available() or os.environ.get("SIDECAR_GPU_TESTS") == "1"
collect_ignore = [] if GPU_TESTS else ["gpu"]


def pytest_report_header(config):
    return None if GPU_TESTS else "tests/gpu not collected: no CUDA device (docs/gpu.md has its last run)"


@pytest.fixture(autouse=True)
def _probe_trace_root(tmp_path_factory, monkeypatch):
    """Probes built in a test write under a folder of the test's, never the user's default trace root."""
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(tmp_path_factory.mktemp("probe-traces")))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_model(tmp_path_factory.mktemp("model") / "tiny", size="tiny")


@pytest.fixture(scope="session")
def vllm_stack(tiny_model, tmp_path_factory):
    """The sidecar and a real multi-process vLLM OpenAI server with the plugin installed."""
    stack = VllmStack(model_dir=tiny_model, work_dir=tmp_path_factory.mktemp("stack"))
    try:
        yield stack.start()
    finally:
        stack.close()


@pytest.fixture(scope="session")
def slow_token_stack(tmp_path_factory):
    """The sidecar and real vLLM serving the fixture models in one (tests/fixtures/slow_token_model,
    ``planted=True``): a prompt ending in SLOW_TOKEN_ID makes one 1.5 s step; HANG_TOKEN_ID hangs a step
    until the file ``env[ENV_HANG_RELEASE]`` exists (60 s at most); every forward makes the planted
    syncs, which a sync scan counts (SIDECAR_SYNC_TREAT_CPU_AS_DEVICE=1); the step watchdog is at 3 s.
    One per session (a server start costs 40-70 s on a 2-core host), for test_vllm_slow_token_fixture.py,
    test_vllm_incidents.py, test_vllm_triggers.py and test_vllm_syncs.py."""
    from slow_token_model import ENV_HANG_RELEASE, ENV_HANG_S, make_model_dir

    model = make_model_dir(tmp_path_factory.mktemp("slow-token") / "model", planted=True)
    work = tmp_path_factory.mktemp("slow-token-stack")
    stack = VllmStack(model_dir=model, work_dir=work, env={
        "SIDECAR_WATCHDOG_S": "3",
        "SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1",
        ENV_HANG_RELEASE: str(work / "release-hang"),
        ENV_HANG_S: "60",  # released early: the bound only has to outlast a slow host's examination
    })
    try:
        yield stack.start()
    finally:
        stack.close()


class BackgroundLoad:
    """Streaming clients running in a thread while a test does something else."""

    def __init__(self, stack: Stack, concurrency: int, duration_s: float, max_tokens: int = 48) -> None:
        self.result: LoadResult | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=lambda: setattr(self, "result", asyncio.run(run_load(
                stack.server_url, stack.served_name, concurrency=concurrency, duration_s=duration_s,
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
        if exc_type is not None:  # the test failed inside the block: do not keep loading the server
            self._stop.set()
        self._thread.join(timeout=300)

    def join(self) -> LoadResult:
        self._thread.join(timeout=300)
        assert self.result is not None, "load generator did not finish"
        return self.result


@pytest.fixture
def background_load():
    return BackgroundLoad
