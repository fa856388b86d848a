"""Session fixtures of the live telemetry tests: Arize Phoenix (a real OTLP trace backend) and a real
multi-process vLLM server, with the plugin, exporting its spans to it."""

from __future__ import annotations

import asyncio

import pytest

from sidecar.devtools.traffic import run_load
from sidecar_vllm.devtools import VllmStack

from .e2e import Phoenix


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    server = Phoenix(tmp_path_factory.mktemp("phoenix"))
    try:
        yield server.wait_ready()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def traced_stack(tiny_model, phoenix, tmp_path_factory):
    """Sidecar + vLLM; spans to Phoenix within 0.2 s, metrics pushed to the sidecar every 0.5 s."""
    stack = VllmStack(model_dir=tiny_model, work_dir=tmp_path_factory.mktemp("traced-stack"), env={
        "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.otlp_http_endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_METRICS_EXPORTER": "none",  # Phoenix takes traces only; metrics go to the sidecar
        "SIDECAR_METRICS_PUSH_INTERVAL_MS": "500",
        "SIDECAR_SAMPLE_INTERVAL_S": "0.5",
    })
    try:
        stack.start_sidecar()
        stack.start_server()
        stack.wait_for_processes(3, timeout=60)
        # Warm-up: the first requests of a fresh server pay one-off costs (first prefill shapes, imports).
        warm = asyncio.run(run_load(stack.server_url, stack.served_name, concurrency=2, requests=4, max_tokens=8))
        assert not warm.failures, warm.failures[:2]
        yield stack
    finally:
        stack.close()
