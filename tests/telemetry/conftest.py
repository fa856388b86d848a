"""Session fixtures of the live telemetry tests: Arize Phoenix (a real OTLP trace backend) and a real
multi-process vLLM server, with the plugin, exporting its spans to it. Both come from tests/conftest.py:
Phoenix starts with the session, and the session's vLLM stack exports to it from its start, so these
tests share that server (and what earlier tests left on it) instead of starting one of their own."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def phoenix(_phoenix_server):
    return _phoenix_server.wait_ready()


@pytest.fixture(scope="session")
def traced_stack(vllm_stack, phoenix):
    """The session's sidecar + vLLM: spans to Phoenix within 0.2 s, metrics pushed to the sidecar every
    0.5 s, process samples every 0.5 s (tests/conftest.py, SESSION_STACK_ENV, phoenix_export_env)."""
    assert vllm_stack.env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == phoenix.otlp_http_endpoint, vllm_stack.env
    return vllm_stack
