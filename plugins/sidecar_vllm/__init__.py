"""inference-sidecar's vLLM integration, loaded through vLLM's ``vllm.general_plugins`` entry point.

    plugin           the ``vllm.general_plugins`` entry point: ``register()`` patches classes and never raises
    hooks            the step-path patch table and its wrappers
    profile          ``VLLM_PROFILE``: roles, phase rules, allowlist, OpenTelemetry names (also under ``inference_sidecar.engines``)
    phase_scopes     the named ranges of each process's step phases, on only while a capture records
    model_locator    where a worker's model is, for the module-timing job
    requests_view    the requests in flight as the engine core's scheduler holds them
    stat_logger      request spans and metrics (``vllm.stat_logger_plugins``); finished requests into the recorder
    request_capture  a request that asks to be captured, held in ``AsyncLLM.generate`` until its capture is armed
    capture_end      the capture ended with its request, on the step threads, between two steps
    devtools         ``VllmStack``: a real vLLM server beside the sidecar (tests, benchmarks)
    demo             ``make demo``
"""
