"""The stack launcher is engine-neutral; the vLLM server's command line and environment are the vLLM
plugin's (sidecar_vllm.devtools), unchanged from before the split."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.common import config
from sidecar.devtools.stack import Stack
from sidecar_vllm.devtools import VllmStack


def test_the_vllm_stack_starts_the_server_as_before(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    stack = VllmStack(model_dir=Path("/models/tiny"), work_dir=tmp_path, server_port=8001, sidecar_port=8788,
                      server_args=("--seed", "1"), env={"EXTRA": "x"}, plugin_enabled=False)
    assert stack.server_command() == [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/models/tiny", "--served-model-name", "local", "--host", "127.0.0.1", "--port", "8001",
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "1"]
    env = stack._env()
    assert {k: env[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_NO_USAGE_STATS", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                                "DO_NOT_TRACK", "PYTHONUNBUFFERED", "EXTRA")} == {
        "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
        "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1", "EXTRA": "x"}
    assert env[config.ENV_ENDPOINT] == "http://127.0.0.1:8788" and env[config.ENV_DISABLE] == "1"
    assert env[config.ENV_TOKEN_FILE] == str(tmp_path / "token")
    # The engine's probes write under the trace dir the sidecar is started with.
    assert env[config.ENV_TRACE_DIR] == str(stack.trace_dir)
    assert stack.server_url == "http://127.0.0.1:8001" and stack.trace_dir == tmp_path / "traces"
    assert (stack.processes, stack.log_name, stack.engine_label, stack.health_path) == (3, "vllm.log", "vLLM", "/health")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert stack._env()["VLLM_CPU_KVCACHE_SPACE"] == "4"  # the user's own value wins


def test_the_sidecar_and_the_engine_share_one_trace_root(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr("subprocess.Popen", lambda cmd, env, **kw: started.append((cmd, env)) or _Exited())
    monkeypatch.setattr(Stack, "_wait", lambda *a, **k: None)
    stack = VllmStack(model_dir=tmp_path, work_dir=tmp_path / "work")
    stack.start_sidecar()
    stack.start_server()
    (sidecar_cmd, sidecar_env), (_, server_env) = started
    trace_dir = sidecar_cmd[sidecar_cmd.index("--trace-dir") + 1]
    assert trace_dir == str(stack.trace_dir) == server_env[config.ENV_TRACE_DIR] == sidecar_env[config.ENV_TRACE_DIR]
    mine = VllmStack(model_dir=tmp_path, work_dir=tmp_path, env={config.ENV_TRACE_DIR: str(tmp_path / "t")})
    assert mine.trace_dir == tmp_path / "t" and mine._env()[config.ENV_TRACE_DIR] == str(tmp_path / "t")


class _Exited:
    pid = 0
    returncode = 0

    def poll(self):
        return None


def test_the_neutral_stack_needs_an_engine(tmp_path):
    stack = Stack(model_dir=tmp_path, work_dir=tmp_path)
    with pytest.raises(NotImplementedError, match="Stack does not say how to start"):
        stack.server_command()
    assert stack.processes == 1 and stack.server_env({}) == {}


def test_the_vllm_demo_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "sidecar_vllm.demo", "--help"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "python -m sidecar_vllm.demo" in proc.stdout and "real vLLM with the local model" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "sidecar_vllm.demo", "--model", "/nonexistent"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "is not a model directory" in proc.stderr


_SERVES_ON_SECOND_START = r"""
import http.server, pathlib, socketserver, sys
marker = pathlib.Path(sys.argv[2])
if not marker.exists():
    marker.touch()
    print("OSError: [Errno 98] Address already in use", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
socketserver.TCPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


class _PortRaceStack(Stack):
    """A server that exits with "Address already in use" the first time, as vLLM does when another
    process took its port between ``free_port`` and its bind, and serves the second time."""

    def server_command(self) -> list[str]:
        return [sys.executable, "-c", _SERVES_ON_SECOND_START, str(self.server_port), str(self.work_dir / "tried")]


class _AlwaysFailsStack(Stack):
    def server_command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; print('some other failure'); sys.exit(1)"]


def test_a_server_whose_port_was_taken_starts_again_on_a_new_port(tmp_path):
    stack = _PortRaceStack(model_dir=tmp_path, work_dir=tmp_path)
    first = stack.server_port
    try:
        stack.start_server(timeout=30)
        assert (tmp_path / "tried").exists() and stack.server_port != first
    finally:
        stack.stop_server()


def test_a_server_that_fails_otherwise_is_not_started_again(tmp_path):
    stack = _AlwaysFailsStack(model_dir=tmp_path, work_dir=tmp_path)
    first = stack.server_port
    with pytest.raises(RuntimeError, match="exited with code 1"):
        stack.start_server(timeout=30)
    assert stack.server_port == first
    assert (tmp_path / "server.log").read_text().count("some other failure") == 1
