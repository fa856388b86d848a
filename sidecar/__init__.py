"""inference-sidecar: an on-demand profiling sidecar for LLM inference servers.

The engine-agnostic core (probe, sidecar service, trace merge and analysis, sync detector,
telemetry) lives here and names no engine. What an engine integration tells the core is one
``sidecar.engine.EngineProfile``; ``sidecar.integration`` has the patching and attach helpers every
integration uses. Integrations live in their own packages under ``plugins/`` (``sidecar_vllm``, ...).

A serving loop written by hand is instrumented with ``sidecar.instrument(...)`` (a stable API,
docs/engine-api.md). The names below are loaded on first use: ``import sidecar`` imports neither the
probe nor torch nor OpenTelemetry.

The package, lowest layer first: an import only goes down (tests/test_layers.py, docs/architecture.md).
Each folder's ``__init__`` lists its modules.

    common/          the ground floor: config, auth, the probe protocol and its codec, phases, verdicts
    stacks/          Python stacks: the samples file, the probe's sampler, the sidecar's views of them
    syncs/           the hidden-sync detector (engine side)
    engine           ``EngineProfile``: what an engine integration tells the core about its engine
    telemetry/       OpenTelemetry request spans and metrics, step and process metrics
    probe/           the engine-side half, one probe per engine process (capture/: its torch.profiler capture)
    integration/     what every engine plugin builds on: class patching, a probe and telemetry attached once
    instrumentation  ``sidecar.instrument``: the public API for a serving loop written by hand
    analysis/        a trace explained in bounded memory (reader/, questions/, diff/)
    report/          the analysis as HTML pages
    service/         the sidecar process: the HTTP API, its jobs, the merge of a capture's traces
    cli/             the ``sidecar`` command, one module per sub-command, and the HTTP client
    devtools/        the demo, an engine server beside the sidecar, a load generator
"""

from __future__ import annotations

import importlib
from typing import Any

from .common.version import __version__

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
