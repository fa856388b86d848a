"""inference-sidecar's SGLang integration, loaded through SGLang's ``sglang.srt.plugins`` entry point
(SGLang >= 0.5.11; the hooks support the versions in ``profile.SUPPORTED_VERSIONS``).

``profile`` (``SGLANG_PROFILE``: roles, phase rules, allowlist, OpenTelemetry names; also registered
under ``inference_sidecar.engines``), ``plugin`` (the entry point), ``hooks`` (the patch table),
``devtools`` (a real SGLang server beside the sidecar, for the end-to-end tests). See docs/sglang.md.
"""
