"""The sidecar beside a real SGLang server with this plugin: ``SglangStack`` (the end-to-end tests).

SGLang runs from its own venv, .venv/sglang/ (scripts/install-sglang.sh: a CPU install of SGLang
with this project in it), not from the interpreter running the tests: SGLang pins other torch and
transformers versions than vLLM. CPU quirks (docs/sglang-notes.md, section 8): ``--device cpu``, a
small KV cache (by default SGLang sizes it from host memory), no warmup request, and never
``SGLANG_USE_CPU_ENGINE`` (it needs a CPU build of sgl-kernel). Nothing here imports SGLang.
"""

from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.devtools.stack import Stack, free_port

__all__ = ["SglangStack", "free_port", "sglang_python", "INSTALL_HINT"]

REPO = Path(__file__).resolve().parents[2]
VENV_PYTHON = REPO / ".venv" / "sglang" / "bin" / "python"
INSTALL_HINT = "run scripts/install-sglang.sh (it builds the CPU SGLang venv .venv/sglang/, about 6 minutes)"


def sglang_python() -> Path:
    """The SGLang venv's interpreter; FileNotFoundError naming the install script when it is absent."""
    if not VENV_PYTHON.exists():
        raise FileNotFoundError(f"no SGLang venv at {VENV_PYTHON.parent.parent}: {INSTALL_HINT}")
    return VENV_PYTHON


@dataclass
class SglangStack(Stack):
    python: Path = field(default_factory=lambda: VENV_PYTHON)

    engine_label = "SGLang"
    log_name = "sglang.log"
    health_path = "/health"
    processes = 2  # the HTTP server (TokenizerManager) and one scheduler (TP rank 0)

    def server_command(self) -> list[str]:
        return [
            str(self.python), "-m", "sglang.launch_server",
            "--model-path", str(self.model_dir), "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(self.server_port),
            "--device", "cpu", "--max-total-tokens", "8192", "--skip-server-warmup",
            *self.server_args,
        ]

    def first_request(self, timeout: float = 60) -> None:
        """One short completion. SGLang creates the HTTP server's event loop on its first request, so
        that process's probe connects to the sidecar only then."""
        body = json.dumps({"model": self.served_name, "prompt": "hello", "max_tokens": 2}).encode()
        req = urllib.request.Request(f"{self.server_url}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()

    def start(self, processes: int | None = None, server_timeout: float = 300) -> "SglangStack":
        """The sidecar, the server (about a minute on 2 CPU cores), one request, then wait for its
        processes to connect."""
        self.start_sidecar()
        self.start_server(timeout=server_timeout)
        self.first_request()
        self.wait_for_processes(processes, timeout=60)
        return self
