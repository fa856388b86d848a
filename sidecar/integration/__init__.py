"""What every engine integration (``plugins/sidecar_<engine>``) builds on, engine-agnostic.

``patching``: apply a table of class patches idempotently, each independent, failures logged.
``attach``: give an engine object its probe / its process telemetry once, for an ``EngineProfile``;
a failure is stored as None and logged, so the engine runs on untouched.

Nothing is imported here: ``attach`` pulls in the probe and OpenTelemetry, which a plugin loads only
when it patches something.
"""
