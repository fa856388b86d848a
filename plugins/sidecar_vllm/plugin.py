"""Entry point named in pyproject.toml under ``vllm.general_plugins``.

vLLM calls ``register()`` in every process it starts (API server, engine core, each worker), before
engine and worker objects are built, and possibly more than once. It only patches classes; probes
(and their threads) are created when the engine's own objects are, in the process that owns them.
"""

from __future__ import annotations

import logging

from sidecar import config

log = logging.getLogger(__name__)


def register() -> None:
    if config.disabled():
        log.info("inference-sidecar: %s is set; the vLLM plugin patches nothing", config.ENV_DISABLE)
        return
    from . import hooks

    hooks.install()
