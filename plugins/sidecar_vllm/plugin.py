"""Entry point named in pyproject.toml under ``vllm.general_plugins``.

vLLM calls ``register()`` in every process it starts (API server, engine core, each worker), before
engine and worker objects are built, and possibly more than once. It only patches classes (and names
the server's engine instance for the processes it starts); probes (and their threads) are created
when the engine's own objects are, in the process that owns them.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import socket

from sidecar.common import config

log = logging.getLogger(__name__)

# vLLM names each data-parallel engine core's process ``EngineCore_DP<k>`` (vllm/v1/engine/utils.py,
# ``CoreEngineProcManager``; ``EngineCore`` without data parallelism). Its config cannot tell: for a
# dense model each DP engine is reconfigured as an independent one (``data_parallel_size`` 1, rank 0;
# only ``data_parallel_index`` keeps k, and k = 0 reads as no data parallelism at all).
_DP_ENGINE_PROCESS = re.compile(r"EngineCore_DP(\d+)\Z")


def register() -> None:
    if config.disabled():
        log.info("inference-sidecar: %s is set; the vLLM plugin patches nothing", config.ENV_DISABLE)
        return
    # The first vLLM process to load the plugin is the server's (the API server, or an offline LLM):
    # its engine core and workers, started after, inherit the variable: one instance per server.
    os.environ.setdefault(config.ENV_INSTANCE, f"{socket.gethostname()}-{os.getpid()}")
    # A data-parallel engine core names its own sub-instance before it starts its workers (vLLM loads
    # the plugins first in EngineCore.__init__), so they inherit it too.
    os.environ[config.ENV_INSTANCE] = data_parallel_instance(os.environ[config.ENV_INSTANCE],
                                                             multiprocessing.current_process().name)
    from . import hooks

    hooks.install()


def data_parallel_instance(server: str, process_name: str) -> str:
    """The engine instance of a process named ``process_name``: ``<server>/dp<k>`` in data-parallel engine
    core k (each counts its own steps), the server's own anywhere else. Idempotent: vLLM may load the
    plugin more than once in a process."""
    match = _DP_ENGINE_PROCESS.match(process_name)
    if match is None or not server or server.endswith(f"/dp{match[1]}"):
        return server
    return f"{server}/dp{match[1]}"
