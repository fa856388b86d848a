"""inference-sidecar's vLLM integration, loaded through vLLM's ``vllm.general_plugins`` entry point.

``profile`` (``VLLM_PROFILE``: roles, phase rules, allowlist, OpenTelemetry names; also registered
under ``inference_sidecar.engines``), ``plugin`` (the entry point), ``hooks`` (the step-path patch
table), ``stat_logger`` (request telemetry), ``devtools`` / ``demo`` (a real vLLM server beside the
sidecar, ``make demo``).
"""
