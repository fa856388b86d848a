"""Request telemetry: OpenTelemetry spans and metrics for LLM inference servers (docs/telemetry.md).

Engine-agnostic: the engine's names (``service.name``, ``gen_ai.provider.name``) come from its
``sidecar.engine.EngineProfile``.

    settings     the environment: the standard ``OTEL_*`` variables plus a few ``SIDECAR_*`` ones
    setup        the tracer and meter providers of one process
    instruments  metric instruments, their names and bucket boundaries (a stable interface)
    requests     a finished request → one span tree and its metrics, with the engine's own timestamps
    clock        an engine's monotonic timestamps → the wall clock spans need
    export       the bounded, dropping span export: the caller never waits on the backend
    push         metrics pushed to the sidecar (OTLP/HTTP) for its one /metrics
    steps        step metrics and sampled step spans
    gpu          GPU utilisation, memory, power and temperature through NVML
    process      process CPU time and resident memory through psutil
    sampling     the one background thread that runs the samplers and the step drain
    capture      a capture as a span, linked to the request spans in flight while it recorded
    inflight     a request span's identity (its parent from W3C headers, its ids chosen on arrival); the requests in flight
"""

from .capture import CaptureRecord, CaptureSpans, record_capture
from .clock import ClockOffset
from .inflight import InFlightRequests, PresetIdGenerator
from .requests import FinishedRequest, operation_from_request_id, record_request
from .settings import TelemetrySettings
from .setup import Telemetry, create_telemetry, make_resource

__all__ = [
    "CaptureRecord", "CaptureSpans", "ClockOffset", "FinishedRequest", "InFlightRequests", "PresetIdGenerator",
    "Telemetry", "TelemetrySettings", "create_telemetry",
    "make_resource", "operation_from_request_id", "record_capture", "record_request",
]
