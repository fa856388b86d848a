"""Engine processes push their metrics to the sidecar (OTLP/HTTP, protobuf) for its one /metrics.

The URL is the sidecar's endpoint plus ``sidecar.common.protocol.METRICS_PUSH_PATH``
(``TelemetrySettings.sidecar_metrics_url``), where ``sidecar.service.routes.metrics`` listens.

The body is ``encode_metrics``'s, the OTLP exporters' own encoding: histogram points carry their
exemplars (trace and span ids, the request id in ``filtered_attributes``; requests.py), which the
sidecar shows on its OpenMetrics ``/metrics``.

A MetricExporter with a short timeout and no retries: the next push carries the same cumulative
values, so a lost one costs nothing. It runs on the metric reader's thread, never on the engine's
step path. The token is read on every push, so a sidecar started after the engine is picked up.
An unreachable sidecar is logged once, and once more when it is reachable again.

The token is never sent: each push is signed (``X-Sidecar-Timestamp``, ``X-Sidecar-Signature`` =
HMAC-SHA256 of the timestamp and the body's SHA-256, sidecar/common/auth.py), so whatever listens on the
sidecar's port learns nothing it could use for another body or, after a minute, at all. Without a
token the push goes unsigned (a sidecar always has one, and refuses it).
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from typing import Callable

from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics import (
    Counter,
    Histogram,
    ObservableCounter,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
    _Gauge,
)

from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter, MetricExportResult, MetricsData

from ..common import auth

log = logging.getLogger(__name__)

CUMULATIVE = {
    kind: AggregationTemporality.CUMULATIVE
    for kind in (Counter, UpDownCounter, Histogram, _Gauge, ObservableCounter, ObservableUpDownCounter, ObservableGauge)
}


class SidecarMetricExporter(MetricExporter):
    def __init__(self, url: str, token_provider: Callable[[], str | None] = auth.read_token,
                 timeout_s: float = 2.0) -> None:
        super().__init__(preferred_temporality=CUMULATIVE)
        self._url = url
        self._token_provider = token_provider
        self._timeout = timeout_s
        # The sidecar is local: never route these pushes through an HTTP proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._failing = False
        self.pushes = 0
        self.failures = 0

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        body = encode_metrics(metrics_data).SerializeToString()
        headers = {"Content-Type": "application/x-protobuf"}
        token = self._token_provider()
        if token:
            headers.update(auth.push_headers(token, body, time.time()))
        request = urllib.request.Request(self._url, data=body, headers=headers, method="POST")
        try:
            with self._opener.open(request, timeout=min(self._timeout, timeout_millis / 1000)) as response:
                response.read()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self.failures += 1
            if not self._failing:
                self._failing = True
                log.info("inference-sidecar: cannot push metrics to %s (%s); retrying quietly", self._url, exc)
            return MetricExportResult.FAILURE
        self.pushes += 1
        if self._failing:
            self._failing = False
            log.info("inference-sidecar: pushing metrics to %s again", self._url)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        pass
