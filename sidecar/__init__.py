"""inference-sidecar: an on-demand profiling sidecar for LLM inference servers.

The engine-agnostic core (probe, sidecar service, trace merge and analysis, sync detector,
telemetry) lives here and names no engine. What an engine integration tells the core is one
``sidecar.engine.EngineProfile``; ``sidecar.integration`` has the patching and attach helpers every
integration uses. Integrations live in their own packages under ``plugins/`` (``sidecar_vllm``, ...).

A serving loop written by hand is instrumented with ``sidecar.instrument(...)`` (a stable API,
docs/engine-api.md). The names below are loaded on first use: ``import sidecar`` imports neither the
probe nor torch nor OpenTelemetry.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# The public API (docs/engine-api.md): name -> the module that defines it.
_PUBLIC = {
    "instrument": "sidecar.instrumentation",
    "Instrumentation": "sidecar.instrumentation",
    "Step": "sidecar.instrumentation",
    "EngineProfile": "sidecar.engine",
    "Role": "sidecar.engine",
    "SCHEDULER": "sidecar.engine",
    "API_SERVER": "sidecar.engine",
    "ENGINE_CORE": "sidecar.engine",
    "WORKER": "sidecar.engine",
    "PhaseRule": "sidecar.syncs.sites",
    "FORWARD": "sidecar.syncs.sites",
    "SAMPLING": "sidecar.syncs.sites",
    "SCHEDULING": "sidecar.syncs.sites",
    "AllowEntry": "sidecar.syncs.allowlist",
    "FinishedRequest": "sidecar.telemetry",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'sidecar' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
