"""The sidecar's own spans (``sync_scan``, ``trigger_firing``) to the OTLP backend that the standard
``OTEL_*`` variables name, as the engine's processes send theirs (docs/telemetry.md).

Only ``sidecar serve`` calls this: it sets the process's global TracerProvider, which the service's
modules reach through ``opentelemetry.trace.get_tracer``. Without an OTLP endpoint (or with
``OTEL_TRACES_EXPORTER=none``, ``OTEL_SDK_DISABLED=true``, ``SIDECAR_TELEMETRY=0``) nothing is set
and those spans stay no-ops.
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping

log = logging.getLogger(__name__)

SERVICE_NAME = "inference-sidecar"  # the default service.name of the sidecar's spans; OTEL_SERVICE_NAME wins


def start_tracing(env: Mapping[str, str] | None = None) -> Callable[[], None] | None:
    """Install a TracerProvider exporting over OTLP when the environment asks for spans; returns its
    shutdown (a bounded flush), or None when spans are off."""
    from ..telemetry.settings import TelemetrySettings

    settings = TelemetrySettings.from_env(env)
    if not (settings.enabled and settings.traces):
        return None
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from ..telemetry.setup import make_resource, otlp_span_exporter

    provider = TracerProvider(resource=make_resource("sidecar", service_name=SERVICE_NAME), shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(otlp_span_exporter(settings.traces_protocol),
                                                   max_queue_size=settings.span_queue_size,
                                                   # Passed, not left to the SDK: it reads its own default
                                                   # batch (512) and refuses one larger than a smaller queue.
                                                   max_export_batch_size=settings.span_batch_size,
                                                   schedule_delay_millis=settings.span_schedule_delay_ms))
    trace.set_tracer_provider(provider)
    log.info("inference-sidecar: the sidecar's spans go to OTLP (%s)", settings.traces_protocol)

    def shutdown() -> None:
        provider.force_flush(timeout_millis=2000)
        provider.shutdown()

    return shutdown
