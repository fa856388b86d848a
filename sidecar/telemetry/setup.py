"""Build the tracer and meter providers of one process from ``TelemetrySettings``.

Nothing is installed globally (no ``set_tracer_provider``): the caller keeps the ``Telemetry`` object,
and tests pass in-memory exporters and readers instead of the OTLP ones.

At exit each ``Telemetry`` shuts itself down within ``SHUTDOWN_TIMEOUT_S`` (last samples, last span
batch, last metric export). The SDK's own exit handlers are off: theirs wait up to 30 s per provider,
and against a dead OTLP endpoint each final export retried with backoff for up to 10 s, which kept
an engine's API server from exiting for 14-30 s after SIGTERM.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import time
import uuid
from typing import Callable, Mapping, Sequence

from opentelemetry import trace
from opentelemetry.metrics import Meter, MeterProvider as ApiMeterProvider, NoOpMeterProvider
from opentelemetry.sdk.metrics import (
    AlwaysOffExemplarFilter,
    AlwaysOnExemplarFilter,
    ExemplarFilter,
    MeterProvider,
    TraceBasedExemplarFilter,
)
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from ..common.version import __version__
from ..common import auth
from ..engine import GENERIC, EngineProfile
from .export import DROP_EXPORT_FAILED, DROP_QUEUE_FULL, DROP_SHUTDOWN, BoundedSpanProcessor
from .gpu import GpuSampler
from .inflight import PresetIdGenerator
from .instruments import SPANS_DROPPED, RequestInstruments, StepInstruments, request_views
from .process import ProcessSampler
from .push import SidecarMetricExporter
from .sampling import PeriodicTasks
from .settings import (
    EXEMPLARS_ALWAYS_OFF,
    EXEMPLARS_ALWAYS_ON,
    EXEMPLARS_TRACE_BASED,
    PROTOCOL_GRPC,
    TelemetrySettings,
)
from .steps import StepRecorder

log = logging.getLogger(__name__)

SCOPE = "inference-sidecar"
STEP_DRAIN_INTERVAL_S = 1.0
SHUTDOWN_TIMEOUT_S = 2.0  # all of a process's telemetry shutdown, dead backends included
_FILTER_CLASSES: dict[str, type[ExemplarFilter]] = {
    EXEMPLARS_TRACE_BASED: TraceBasedExemplarFilter, EXEMPLARS_ALWAYS_ON: AlwaysOnExemplarFilter,
    EXEMPLARS_ALWAYS_OFF: AlwaysOffExemplarFilter}


def make_resource(role: str, rank: int | None = None, service_name: str = GENERIC.service_name) -> Resource:
    """This process's resource. ``service_name`` is the engine profile's default
    (``EngineProfile.service_name``); ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` override it."""
    attrs: dict = {"service.name": service_name, "service.instance.id": str(uuid.uuid4()),
                   "host.name": socket.gethostname(), "process.pid": os.getpid(), "sidecar.process.role": role}
    if rank is not None:
        attrs["sidecar.process.rank"] = rank
    resource = Resource(attrs).merge(OTELResourceDetector().detect())
    env_name = os.environ.get("OTEL_SERVICE_NAME", "").strip()
    if env_name:
        resource = resource.merge(Resource({"service.name": env_name}))
    return resource


def otlp_span_exporter(protocol: str) -> SpanExporter:
    if protocol == PROTOCOL_GRPC:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

            return GrpcSpanExporter()
        except ImportError:
            log.warning("inference-sidecar: OTLP gRPC asked for but opentelemetry-exporter-otlp-proto-grpc is "
                        "not installed; exporting spans over http/protobuf")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _otlp_metric_reader(settings: TelemetrySettings) -> MetricReader:
    exporter = None
    if settings.metrics_protocol == PROTOCOL_GRPC:
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

            exporter = Grpc()
        except ImportError:
            log.warning("inference-sidecar: OTLP gRPC metrics asked for but the gRPC exporter is not installed; "
                        "using http/protobuf")
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        exporter = OTLPMetricExporter()
    return PeriodicExportingMetricReader(exporter, export_interval_millis=settings.metric_export_interval_ms)


class Telemetry:
    """One process's telemetry: tracer, meter, instruments, background samplers."""

    def __init__(
        self,
        settings: TelemetrySettings,
        resource: Resource,
        *,
        span_exporter: SpanExporter | None = None,
        metric_readers: Sequence[MetricReader] | None = None,
        token_provider: Callable[[], str | None] = auth.read_token,
    ) -> None:
        self.settings = settings
        self.resource = resource
        self.span_processor: BoundedSpanProcessor | None = None
        self.push_exporter: SidecarMetricExporter | None = None
        self._tasks = PeriodicTasks()
        self._gpu: GpuSampler | None = None
        self._closed = False

        readers = list(metric_readers or [])
        if settings.enabled and metric_readers is None:
            if settings.sidecar_metrics_url:
                self.push_exporter = SidecarMetricExporter(settings.sidecar_metrics_url, token_provider)
                readers.append(PeriodicExportingMetricReader(
                    self.push_exporter, export_interval_millis=settings.metrics_push_interval_ms))
            if settings.otlp_metrics:
                readers.append(_otlp_metric_reader(settings))
        # The exemplar filter is set here, never left to the SDK's own reading of the environment (which
        # raises on a value it does not know); with exemplars on, the request histograms' Views.
        self.meter_provider: ApiMeterProvider = (
            MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False,
                          exemplar_filter=_FILTER_CLASSES[settings.exemplar_filter](),
                          views=request_views(SCOPE) if settings.exemplars else ())
            if settings.enabled else NoOpMeterProvider())
        self.meter: Meter = self.meter_provider.get_meter(SCOPE, __version__)

        self.tracer_provider: TracerProvider | None = None
        if settings.enabled and (settings.traces or span_exporter is not None):
            exporter = span_exporter or otlp_span_exporter(settings.traces_protocol)
            dropped = self.meter.create_counter(SPANS_DROPPED, unit="{span}",
                                                description="Spans dropped before export, by reason.")
            for reason in (DROP_QUEUE_FULL, DROP_EXPORT_FAILED, DROP_SHUTDOWN):
                dropped.add(0, {"reason": reason})  # the series exist at 0 from the start: "no drops" is data
            self.span_processor = BoundedSpanProcessor(
                exporter, max_queue_size=settings.span_queue_size, max_batch_size=settings.span_batch_size,
                schedule_delay_s=settings.span_schedule_delay_ms / 1000,
                on_drop=lambda n, reason: dropped.add(n, {"reason": reason}))
            # Request spans take the ids chosen when their request arrived (inflight.py).
            self.tracer_provider = TracerProvider(resource=resource, id_generator=PresetIdGenerator(),
                                                  shutdown_on_exit=False)
            self.tracer_provider.add_span_processor(self.span_processor)
            self.tracer: trace.Tracer = self.tracer_provider.get_tracer(SCOPE, __version__)
        else:
            self.tracer = trace.NoOpTracer()
        self.requests = RequestInstruments(self.meter, exemplars=settings.exemplars)
        if settings.enabled:
            # Held until exit, as the SDK's handlers held the providers: the engine object that owns
            # this may be gone by then, and its last export must still happen, bounded.
            atexit.register(self.shutdown)

    @property
    def traces_on(self) -> bool:
        return self.tracer_provider is not None

    @property
    def samples_gpus(self) -> bool:
        """Whether NVML found GPUs to read: start_samplers(gpu=True) on a host with an NVIDIA driver."""
        return self._gpu is not None

    def step_recorder(self, role: str) -> StepRecorder:
        """A recorder for this process's steps, drained by the sampler thread (start_samplers)."""
        recorder = StepRecorder(StepInstruments(self.meter), role=role,
                                tracer=self.tracer if self.traces_on else None,
                                span_ratio=self.settings.step_spans_ratio)
        self._tasks.add(STEP_DRAIN_INTERVAL_S, recorder.drain)
        return recorder

    def start_samplers(self, *, process: bool = True, gpu: bool = False, nvml=None) -> "Telemetry":
        """Start the background thread: process CPU/RSS, GPUs through NVML (one process per host should)."""
        if not self.settings.enabled:
            return self
        interval = self.settings.sample_interval_s
        if process:
            self._tasks.add(interval, ProcessSampler(self.meter).sample)
        if gpu:
            self._gpu = GpuSampler.create(self.meter, nvml)
            if self._gpu is not None:
                self._tasks.add(interval, self._gpu.sample)
        self._tasks.start()
        return self

    def run_tasks_once(self) -> None:
        self._tasks.run_once()

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Flush and stop, returning within about ``timeout_s`` whatever the backends do: spans get up
        to half of it, metrics the rest; an export still retrying then is abandoned (and counted)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        deadline = time.monotonic() + timeout_s

        def left_s() -> float:
            return max(0.0, deadline - time.monotonic())

        self._tasks.stop(timeout_s=left_s() / 4)
        self._tasks.run_once()  # last step drain and samples, so they are in the final export
        if self.span_processor is not None:
            self.span_processor.shutdown(timeout_millis=left_s() / 2 * 1000)
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()  # its one processor is already shut down: returns at once
        if isinstance(self.meter_provider, MeterProvider):
            try:
                # Readers one after another, each with what is left; each one's exporter is shut down
                # when its time is up, which ends an OTLP exporter's retries.
                self.meter_provider.shutdown(timeout_millis=left_s() * 1000)
            except Exception as exc:  # a reader the deadline left no time for: its last export is lost
                log.debug("inference-sidecar: metric shutdown incomplete: %s", exc)
        if self._gpu is not None:
            self._gpu.close()


def create_telemetry(role: str, rank: int | None = None, *, profile: EngineProfile = GENERIC,
                     env: Mapping[str, str] | None = None, **kwargs) -> Telemetry:
    """Telemetry for a process of ``profile``'s engine, configured from the environment (the plugin's
    entry point); the resource's default ``service.name`` is the profile's."""
    return Telemetry(TelemetrySettings.from_env(env), make_resource(role, rank, profile.service_name), **kwargs)
