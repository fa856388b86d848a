import logging
import threading
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from sidecar.telemetry.export import DROP_EXPORT_FAILED, DROP_QUEUE_FULL, BoundedSpanProcessor
from sidecar.telemetry.settings import TelemetrySettings

from .helpers import in_memory_telemetry, metric_points


class BlockedBackend(SpanExporter):
    """A backend that hangs until released, then refuses everything (as a collector that is down)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def export(self, spans):
        self.calls += 1
        self.release.wait(10)
        return SpanExportResult.FAILURE

    def shutdown(self):
        self.release.set()


def test_full_queue_drops_oldest_counts_and_never_blocks_the_caller():
    backend = BlockedBackend()
    drops = []
    processor = BoundedSpanProcessor(backend, max_queue_size=8, max_batch_size=4, schedule_delay_s=0.01,
                                     on_drop=lambda n, reason: drops.append((n, reason)))
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    tracer.start_span("first").end()
    deadline = time.monotonic() + 5
    while backend.calls == 0 and time.monotonic() < deadline:  # the export thread is now stuck in export
        time.sleep(0.005)
    started = time.perf_counter()
    for i in range(100):
        tracer.start_span(f"s{i}").end()
    elapsed = time.perf_counter() - started
    assert elapsed < 0.5  # 100 spans while the backend hangs: the caller never waited on it
    assert processor.dropped == 100 - 8
    assert sum(n for n, reason in drops if reason == DROP_QUEUE_FULL) == 92
    backend.release.set()
    processor.force_flush(5000)
    # Every span is either dropped from the queue or dropped by the failing export; all are counted.
    assert processor.dropped == 101
    assert sum(n for n, reason in drops if reason == DROP_EXPORT_FAILED) == 9
    provider.shutdown()


def test_drops_reach_the_dropped_spans_counter():
    telemetry, exporter, reader = in_memory_telemetry(span_queue_size=2, span_batch_size=2)
    exporter.shutdown()  # an in-memory exporter that is shut down refuses every batch
    for i in range(5):
        telemetry.tracer.start_span(f"s{i}").end()
    telemetry.span_processor.force_flush(5000)
    points = metric_points(reader, "sidecar.telemetry.spans.dropped")
    assert sum(p.value for p in points) == 5
    # Every reason exists from the start (at 0), so "no drops" is data on a dashboard; none at shutdown here.
    assert {p.attributes["reason"] for p in points} == {"queue_full", "export_failed", "shutdown"}
    assert sum(p.value for p in points if p.attributes["reason"] == "shutdown") == 0


def test_settings_from_standard_environment():
    s = TelemetrySettings.from_env({})
    assert s.enabled and not s.traces and not s.otlp_metrics  # nothing is sent to a default localhost:4318
    assert s.traces_protocol == "http/protobuf"
    assert s.sidecar_metrics_url == "http://127.0.0.1:8787/v1/metrics"
    assert s.step_spans_ratio == 0.0
    s = TelemetrySettings.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                                    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "SIDECAR_STEP_SPANS_RATIO": "0.25",
                                    "SIDECAR_ENDPOINT": "http://sidecar:9000", "OTEL_BSP_MAX_QUEUE_SIZE": "64"})
    assert s.traces and s.otlp_metrics and s.traces_protocol == "grpc" and s.step_spans_ratio == 0.25
    assert s.sidecar_metrics_url == "http://sidecar:9000/v1/metrics" and s.span_queue_size == 64
    s = TelemetrySettings.from_env({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces",
                                    "OTEL_METRICS_EXPORTER": "none"})
    assert s.traces and not s.otlp_metrics
    assert not TelemetrySettings.from_env({"OTEL_SDK_DISABLED": "true"}).enabled
    assert not TelemetrySettings.from_env({"SIDECAR_METRICS_PUSH": "0"}).sidecar_metrics_url


def test_bad_environment_values_fall_back_to_defaults(caplog):
    s = TelemetrySettings.from_env({"SIDECAR_STEP_SPANS_RATIO": "2", "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon",
                                    "OTEL_BSP_MAX_QUEUE_SIZE": "many"})
    assert s.step_spans_ratio == 0.0 and s.traces_protocol == "http/protobuf" and s.span_queue_size == 2048
    assert "SIDECAR_STEP_SPANS_RATIO" in caplog.text and "carrier-pigeon" in caplog.text


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        TelemetrySettings(step_spans_ratio=1.5)
    with pytest.raises(ValueError):
        TelemetrySettings(traces_protocol="udp")


def test_a_bad_boolean_is_an_error_naming_the_variable_and_the_default_stays(caplog):
    with caplog.at_level(logging.ERROR):
        s = TelemetrySettings.from_env({"SIDECAR_METRICS_PUSH": "perhaps", "SIDECAR_TELEMETRY": "sure"})
    assert s.enabled and s.sidecar_metrics_url == "http://127.0.0.1:8787/v1/metrics"
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("SIDECAR_METRICS_PUSH" in m and "perhaps" in m for m in errors)
    assert any("SIDECAR_TELEMETRY" in m and "sure" in m for m in errors)
    for off in ("0", "false", "No", " OFF "):
        assert not TelemetrySettings.from_env({"SIDECAR_TELEMETRY": off}).enabled
    assert TelemetrySettings.from_env({"SIDECAR_TELEMETRY": ""}).enabled  # empty: the default
