"""Request telemetry: OpenTelemetry spans and metrics for LLM inference servers (docs/telemetry.md).

Engine-agnostic: the engine's names (``service.name``, ``gen_ai.provider.name``) come from its
``sidecar.engine.EngineProfile``. One module per concept: ``settings`` (environment), ``setup``
(providers of one process), ``instruments`` (metric names and buckets), ``requests`` (a finished
request → span tree + metrics), ``clock`` (engine monotonic → wall clock), ``export`` (bounded,
dropping span export), ``push`` (metrics to the sidecar), ``steps`` (step metrics and sampled step
spans), ``gpu`` / ``process`` (samplers), ``sampling`` (their thread), ``capture`` (a capture as a
span), ``inflight`` (a request span's identity: its parent from W3C headers, its ids chosen on
arrival; the requests in flight).
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
