"""inference-sidecar: an on-demand profiling sidecar for LLM inference servers.

The engine-agnostic core (probe, sidecar service, trace merge and analysis, sync detector,
telemetry) lives here and names no engine. What an engine integration tells the core is one
``sidecar.engine.EngineProfile``; ``sidecar.integration`` has the patching and attach helpers every
integration uses. Integrations live in their own packages under ``plugins/`` (``sidecar_vllm``, ...).
"""

__version__ = "0.1.0"
