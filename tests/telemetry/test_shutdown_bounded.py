"""Issue #10, defect 10: telemetry shutdown is bounded whatever the OTLP backend does.

vLLM's API server took 14-30 s to exit on SIGTERM when its OTLP endpoint was down: at exit the SDK's
providers shut down with their 30 s defaults, and each final export retried with backoff for up to
``OTEL_EXPORTER_OTLP_TIMEOUT`` (10 s). The plugin's telemetry (``create_telemetry`` with vLLM's
profile, as the stat logger builds it) is exercised here against an endpoint that refuses connections
and one that accepts them and never answers, both through ``Telemetry.shutdown`` and through a
process's normal exit (the path vLLM takes).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from sidecar.devtools.stack import free_port
from sidecar.telemetry import create_telemetry
from sidecar.telemetry.setup import SHUTDOWN_TIMEOUT_S
from sidecar_vllm.profile import ROLE_API_SERVER, VLLM_PROFILE

# Correctness bounds, not benchmarks: the shutdown's own budget plus room for a loaded machine.
SHUTDOWN_BOUND_S = SHUTDOWN_TIMEOUT_S + 1.5
EXIT_BOUND_S = SHUTDOWN_TIMEOUT_S + 3.0


@contextlib.contextmanager
def dead_endpoint(kind: str):
    """``refused``: nothing listens. ``silent``: a listener that never accepts, so a request's
    connection is made (by the kernel) and never answered, like a collector that hangs."""
    if kind == "refused":
        yield f"http://127.0.0.1:{free_port()}"
        return
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def dead_env(endpoint: str) -> dict[str, str]:
    """Spans and metrics to the dead OTLP endpoint, metric pushes to a dead sidecar. In the process's
    environment: the OTLP exporters read it themselves."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "SIDECAR_ENDPOINT": endpoint, "SIDECAR_TOKEN": "t" * 32}


def some_telemetry(telemetry) -> None:
    """A few spans in the queue and a metric point: something for every final export."""
    for i in range(3):
        telemetry.tracer.start_span(f"request {i}").end()
    telemetry.requests.requests.add(1, {"gen_ai.operation.name": "chat"})


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_shutdown_returns_in_time_with_a_dead_backend(kind, monkeypatch):
    with dead_endpoint(kind) as endpoint:
        for name, value in dead_env(endpoint).items():
            monkeypatch.setenv(name, value)
        telemetry = create_telemetry(ROLE_API_SERVER, profile=VLLM_PROFILE)
        assert telemetry.traces_on and telemetry.settings.otlp_metrics and telemetry.push_exporter is not None
        some_telemetry(telemetry)
        started = time.monotonic()
        telemetry.shutdown()
        took = time.monotonic() - started
    assert took < SHUTDOWN_BOUND_S, f"telemetry shutdown took {took:.1f} s against a {kind} endpoint"
    assert telemetry.span_processor.exported == 0
    if kind == "refused":  # (a request to the silent one is still in flight: counted when it times out)
        assert telemetry.span_processor.dropped == 3  # counted, not silently lost
    telemetry.shutdown()  # a second call (atexit after an explicit one) does nothing


CHILD = textwrap.dedent("""
    from sidecar.telemetry import create_telemetry
    from sidecar_vllm.profile import ROLE_API_SERVER, VLLM_PROFILE
    telemetry = create_telemetry(ROLE_API_SERVER, profile=VLLM_PROFILE).start_samplers(process=True)
    for i in range(3):
        telemetry.tracer.start_span(f"request {i}").end()
    telemetry.requests.requests.add(1, {"gen_ai.operation.name": "chat"})
    print("ready", flush=True)
    # Returns without shutting anything down: the process's exit handlers do, as in vLLM.
""")


@pytest.mark.parametrize("kind", ["refused", "silent"])
def test_a_process_exits_in_time_with_a_dead_backend(kind):
    with dead_endpoint(kind) as endpoint:
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, env={**os.environ, **dead_env(endpoint)})
        try:
            lines = []
            for line in child.stdout:  # imports first (not timed), then "ready"
                lines.append(line)
                if line.strip() == "ready":
                    break
            started = time.monotonic()
            code = child.wait(timeout=60)
            took = time.monotonic() - started
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert lines and lines[-1].strip() == "ready", "".join(lines)
    assert code == 0
    assert took < EXIT_BOUND_S, f"the process took {took:.1f} s to exit against a {kind} endpoint"
