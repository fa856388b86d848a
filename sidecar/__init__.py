"""inference-sidecar: an on-demand profiling sidecar for LLM inference servers.

The engine-agnostic core (probe, sidecar service, trace merge and analysis) lives here; engine
integrations live in their own packages under ``plugins/`` (``sidecar_vllm``, ...).
"""

__version__ = "0.1.0"
