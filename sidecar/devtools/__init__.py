"""Tools for the demo, the tests and the benchmarks, engine-neutral: ``local_model`` (a small model
with no hub), ``stack`` (the sidecar beside an engine server; engines subclass ``Stack``), ``traffic``
(an OpenAI-compatible streaming load generator) and ``demo`` (``make demo`` for any engine)."""
