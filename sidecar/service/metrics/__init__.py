"""The sidecar's /metrics: one Prometheus target for every engine process (docs/telemetry.md).

    store             the latest pushed points of every engine process, rendered on scrape
    otlp_translation  OpenTelemetry metrics → Prometheus, as the OpenTelemetry Prometheus exporter translates them
    captures          the sidecar's own metrics about its captures
    engine_state      gauges of the engine's state from the heartbeats (requests in flight, stuck and running steps)
    sync_findings     scan findings: a Prometheus counter and a span per scan
"""
