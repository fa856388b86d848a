"""Entry point named in pyproject.toml under ``sglang.srt.plugins`` (SGLang >= 0.5.11).

SGLang's ``load_plugins()`` calls ``register()`` in every process it starts (the HTTP server, each
scheduler before its ``Scheduler`` is built, the detokenizer), possibly more than once. It only
patches classes; probes (and their threads) are created when SGLang's own objects are, in the process
that owns them. It never raises: a failure is logged and SGLang runs untouched.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def register() -> None:
    try:
        from sidecar.common import config

        if config.disabled():
            log.info("inference-sidecar: %s is set; the SGLang plugin patches nothing", config.ENV_DISABLE)
            return
        from . import hooks

        hooks.install()
    except Exception as exc:  # a plugin that raises would stop SGLang's start-up
        log.warning("inference-sidecar: SGLang plugin not installed: %s", exc)
