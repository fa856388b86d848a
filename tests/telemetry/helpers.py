"""Shared pieces of the telemetry tests: in-memory telemetry and metric lookups."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sidecar.telemetry import Telemetry, TelemetrySettings


def in_memory_telemetry(**settings) -> tuple[Telemetry, InMemorySpanExporter, InMemoryMetricReader]:
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry = Telemetry(TelemetrySettings(span_schedule_delay_ms=10, **settings),
                          Resource({"service.name": "test", "sidecar.process.role": "api_server"}),
                          span_exporter=exporter, metric_readers=[reader])
    return telemetry, exporter, reader


def metric_points(reader: InMemoryMetricReader, name: str) -> list:
    data = reader.get_metrics_data()
    points = []
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    points.extend(metric.data.data_points)
    return points
