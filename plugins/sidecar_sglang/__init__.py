"""inference-sidecar's SGLang integration, loaded through SGLang's ``sglang.srt.plugins`` entry point
(SGLang >= 0.5.11; the hooks support the versions in ``profile.SUPPORTED_VERSIONS``). See docs/sglang.md.

    plugin         the ``sglang.srt.plugins`` entry point
    hooks          the patch table: a probe on the scheduler's step path, the HTTP server instrumented
    profile        ``SGLANG_PROFILE``: roles, phase rules, allowlist, OpenTelemetry names (also under ``inference_sidecar.engines``)
    requests       SGLang's requests as request telemetry: spans, the GenAI metrics, flight-recorder rows
    requests_view  the requests in flight as TP rank 0's scheduler holds them
    devtools       ``SglangStack``: a real SGLang server beside the sidecar (the end-to-end tests)
"""
