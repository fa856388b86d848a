"""What every engine integration (``plugins/sidecar_<engine>``) builds on, engine-agnostic.

    patching       a table of class patches applied idempotently, each independent, failures logged
    attach         an engine object's probe / process telemetry, given once for an ``EngineProfile``; a
                   failure is stored as None and logged, so the engine runs on untouched
    method_ranges  named ranges around an engine's methods, entered only while a capture records

Nothing is imported here: ``attach`` pulls in the probe and OpenTelemetry, which a plugin loads only
when it patches something.
"""
