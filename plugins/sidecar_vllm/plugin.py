"""Entry point named in pyproject.toml under ``vllm.general_plugins``.

vLLM calls ``register()`` in every process it starts (API server, engine core, each worker), before
engine and worker objects are built, and possibly more than once. It only patches classes (and names
the server's engine instance for the processes it starts); probes (and their threads) are created
when the engine's own objects are, in the process that owns them.
"""

from __future__ import annotations

import logging
import os
import socket

from sidecar import config

log = logging.getLogger(__name__)


def register() -> None:
    if config.disabled():
        log.info("inference-sidecar: %s is set; the vLLM plugin patches nothing", config.ENV_DISABLE)
        return
    # The first vLLM process to load the plugin is the server's (the API server, or an offline LLM):
    # its engine core and workers, started after, inherit the variable: one instance per server.
    os.environ.setdefault(config.ENV_INSTANCE, f"{socket.gethostname()}-{os.getpid()}")
    from . import hooks

    hooks.install()
