"""Servers the end-to-end tests share beyond the session's plain ``vllm_stack`` (tests/conftest.py):

- ``fixture_models`` and ``fault_stack`` (tests/shared_stacks.py: each used by several test files in
  turn, the last of which ends it), started with the session, behind the session's own stack;
- the servers of the tests that run last (tests/conftest.py, ``RUN_LAST``): SGLang, tensor- and
  data-parallel vLLM, a second vLLM server on the session's sidecar, started one after the other from
  the first test after this folder's (tests/conftest.py ``_run_last_servers``, tests/parallel_server.py);
  the fixtures below hand each to its tests and close it after.
"""

from __future__ import annotations

import pytest

from shared_stacks import ReusedStack


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
def second_server(_run_last_servers, vllm_stack):
    """A second real vLLM server whose probes connect to the session stack's sidecar from now on."""
    start = _run_last_servers["multi_server"]
    try:
        start.result().join(vllm_stack.sidecar_port)
        yield start.stack
    finally:
        start.close()


@pytest.fixture(scope="module")
def sglang_stack(_run_last_servers):
    """The sidecar and a real SGLang server (HTTP server, one scheduler, detokenizer) with the plugin,
    for one module's tests."""
    yield from _used_then_closed(_run_last_servers["sglang"])
