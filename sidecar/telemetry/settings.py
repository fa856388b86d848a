"""Telemetry settings: the standard ``OTEL_*`` variables plus a few ``SIDECAR_*`` ones.

One constant per variable with its default. A bad environment value is logged and replaced by the
default (telemetry must never stop an engine from starting; booleans are read by
``sidecar.common.config.env_flag``, which logs an error naming the variable); a bad constructor argument
raises.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Mapping

from ..common import config
from ..common.protocol import METRICS_PUSH_PATH

log = logging.getLogger(__name__)

# -- standard OpenTelemetry variables this package reads itself (the exporters read the rest:
#    endpoints, headers, timeouts, certificates, compression) -------------------------------------
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_METRICS_ENDPOINT = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
OTEL_METRIC_EXPORT_INTERVAL = "OTEL_METRIC_EXPORT_INTERVAL"  # for the user's OTLP metrics exporter
OTEL_BSP_MAX_QUEUE_SIZE = "OTEL_BSP_MAX_QUEUE_SIZE"
OTEL_BSP_MAX_EXPORT_BATCH_SIZE = "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"
OTEL_BSP_SCHEDULE_DELAY = "OTEL_BSP_SCHEDULE_DELAY"
OTEL_METRICS_EXEMPLAR_FILTER = "OTEL_METRICS_EXEMPLAR_FILTER"

PROTOCOL_HTTP = "http/protobuf"
PROTOCOL_GRPC = "grpc"
DEFAULT_PROTOCOL = PROTOCOL_HTTP
DEFAULT_METRIC_EXPORT_INTERVAL_MS = 60000
DEFAULT_BSP_MAX_QUEUE_SIZE = 2048
DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE = 512
DEFAULT_BSP_SCHEDULE_DELAY_MS = 5000
# Which measurements may become exemplars (the specification's values): those recorded inside a sampled
# span (the request histograms, in their request's span), every one, or none.
EXEMPLARS_TRACE_BASED = "trace_based"
EXEMPLARS_ALWAYS_ON = "always_on"
EXEMPLARS_ALWAYS_OFF = "always_off"
EXEMPLAR_FILTERS = (EXEMPLARS_TRACE_BASED, EXEMPLARS_ALWAYS_ON, EXEMPLARS_ALWAYS_OFF)
DEFAULT_EXEMPLAR_FILTER = EXEMPLARS_TRACE_BASED

# -- this package's own variables -----------------------------------------------------------------
# Set to 0/off to load the plugin's telemetry as a no-op (captures still work).
ENV_TELEMETRY = "SIDECAR_TELEMETRY"
# Fraction of engine/worker steps that become spans (0 = no step spans, the default; 1 = all).
ENV_STEP_SPANS_RATIO = "SIDECAR_STEP_SPANS_RATIO"
DEFAULT_STEP_SPANS_RATIO = 0.0
# How often engine processes push their metrics to the sidecar (METRICS_PUSH_PATH; milliseconds).
ENV_METRICS_PUSH_INTERVAL = "SIDECAR_METRICS_PUSH_INTERVAL_MS"
DEFAULT_METRICS_PUSH_INTERVAL_MS = 5000
# Set to 0/off to not push metrics to the sidecar (then no Prometheus target has them).
ENV_METRICS_PUSH = "SIDECAR_METRICS_PUSH"
# How often the NVML and psutil samplers read (seconds).
ENV_SAMPLE_INTERVAL = "SIDECAR_SAMPLE_INTERVAL_S"
DEFAULT_SAMPLE_INTERVAL_S = 5.0


def _number(env: Mapping[str, str], name: str, default: float, lo: float, hi: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:  # also rejects NaN
        log.warning("%s=%r is not a number in [%s, %s]; using %s", name, raw, lo, hi, default)
        return default
    return value


def _protocol(env: Mapping[str, str], signal_var: str) -> str:
    raw = (env.get(signal_var) or env.get(OTEL_EXPORTER_OTLP_PROTOCOL) or DEFAULT_PROTOCOL).strip().lower()
    if raw in (PROTOCOL_HTTP, PROTOCOL_GRPC):
        return raw
    log.warning("OTLP protocol %r is not supported (use %s or %s); using %s", raw, PROTOCOL_HTTP, PROTOCOL_GRPC,
                DEFAULT_PROTOCOL)
    return DEFAULT_PROTOCOL


def _exemplar_filter(env: Mapping[str, str]) -> str:
    raw = env.get(OTEL_METRICS_EXEMPLAR_FILTER, "").strip().lower()
    if not raw or raw in EXEMPLAR_FILTERS:
        return raw or DEFAULT_EXEMPLAR_FILTER
    log.warning("%s=%r is not one of %s; using %s", OTEL_METRICS_EXEMPLAR_FILTER, raw, ", ".join(EXEMPLAR_FILTERS),
                DEFAULT_EXEMPLAR_FILTER)
    return DEFAULT_EXEMPLAR_FILTER


def _exporter_on(env: Mapping[str, str], exporter_var: str, endpoint_var: str) -> bool:
    """OTLP export of one signal is on when the user asked for it by the standard variables.

    ``OTEL_*_EXPORTER=none`` turns it off. Otherwise it is on when an OTLP endpoint is configured or
    ``OTEL_*_EXPORTER`` names ``otlp``; with neither, nothing is sent to the SDK's default
    ``localhost:4318`` (an engine without a collector should not log connection errors forever).
    """
    names = [n.strip().lower() for n in env.get(exporter_var, "").split(",") if n.strip()]
    if "none" in names:
        return False
    if names and "otlp" not in names:
        log.warning("%s=%s: only otlp is supported here; that signal is not exported", exporter_var,
                    env.get(exporter_var))
        return False
    return "otlp" in names or bool(env.get(endpoint_var) or env.get(OTEL_EXPORTER_OTLP_ENDPOINT))


@dataclass(frozen=True)
class TelemetrySettings:
    enabled: bool = True
    traces: bool = False  # OTLP span export to the user's backend
    traces_protocol: str = DEFAULT_PROTOCOL
    otlp_metrics: bool = False  # metrics also to the user's OTLP endpoint (besides the sidecar)
    metrics_protocol: str = DEFAULT_PROTOCOL
    metric_export_interval_ms: int = DEFAULT_METRIC_EXPORT_INTERVAL_MS
    sidecar_metrics_url: str | None = None  # where engine processes push metrics (None: not pushed)
    metrics_push_interval_ms: int = DEFAULT_METRICS_PUSH_INTERVAL_MS
    span_queue_size: int = DEFAULT_BSP_MAX_QUEUE_SIZE
    span_batch_size: int = DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE
    span_schedule_delay_ms: int = DEFAULT_BSP_SCHEDULE_DELAY_MS
    step_spans_ratio: float = DEFAULT_STEP_SPANS_RATIO
    sample_interval_s: float = DEFAULT_SAMPLE_INTERVAL_S
    exemplar_filter: str = DEFAULT_EXEMPLAR_FILTER

    def __post_init__(self) -> None:
        if self.exemplar_filter not in EXEMPLAR_FILTERS:
            raise ValueError(f"exemplar_filter must be one of {EXEMPLAR_FILTERS}")
        if self.traces_protocol not in (PROTOCOL_HTTP, PROTOCOL_GRPC):
            raise ValueError(f"traces_protocol must be {PROTOCOL_HTTP!r} or {PROTOCOL_GRPC!r}")
        if self.metrics_protocol not in (PROTOCOL_HTTP, PROTOCOL_GRPC):
            raise ValueError(f"metrics_protocol must be {PROTOCOL_HTTP!r} or {PROTOCOL_GRPC!r}")
        if not 0.0 <= self.step_spans_ratio <= 1.0:
            raise ValueError("step_spans_ratio must be in [0, 1]")
        for name in ("span_queue_size", "span_batch_size", "span_schedule_delay_ms", "metrics_push_interval_ms",
                     "metric_export_interval_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.sample_interval_s <= 0:
            raise ValueError("sample_interval_s must be positive")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "TelemetrySettings":
        env = os.environ if env is None else env
        if config.env_flag(OTEL_SDK_DISABLED, False, env) or not config.env_flag(ENV_TELEMETRY, True, env):
            return cls(enabled=False)
        push = config.env_flag(ENV_METRICS_PUSH, True, env)
        queue = int(_number(env, OTEL_BSP_MAX_QUEUE_SIZE, DEFAULT_BSP_MAX_QUEUE_SIZE, 1, 1 << 20))
        return cls(
            traces=_exporter_on(env, OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT),
            traces_protocol=_protocol(env, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL),
            otlp_metrics=_exporter_on(env, OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_METRICS_ENDPOINT),
            metrics_protocol=_protocol(env, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL),
            metric_export_interval_ms=int(_number(env, OTEL_METRIC_EXPORT_INTERVAL, DEFAULT_METRIC_EXPORT_INTERVAL_MS,
                                                  1, 86_400_000)),
            sidecar_metrics_url=_endpoint_from(env) + METRICS_PUSH_PATH if push else None,
            metrics_push_interval_ms=int(_number(env, ENV_METRICS_PUSH_INTERVAL, DEFAULT_METRICS_PUSH_INTERVAL_MS,
                                                 100, 3_600_000)),
            span_queue_size=queue,
            span_batch_size=min(queue, int(_number(env, OTEL_BSP_MAX_EXPORT_BATCH_SIZE,
                                                   DEFAULT_BSP_MAX_EXPORT_BATCH_SIZE, 1, 1 << 20))),
            span_schedule_delay_ms=int(_number(env, OTEL_BSP_SCHEDULE_DELAY, DEFAULT_BSP_SCHEDULE_DELAY_MS,
                                               1, 3_600_000)),
            step_spans_ratio=_number(env, ENV_STEP_SPANS_RATIO, DEFAULT_STEP_SPANS_RATIO, 0.0, 1.0),
            sample_interval_s=_number(env, ENV_SAMPLE_INTERVAL, DEFAULT_SAMPLE_INTERVAL_S, 0.05, 3600.0),
            exemplar_filter=_exemplar_filter(env),
        )

    @property
    def exemplars(self) -> bool:
        """Whether measurements may become exemplars at all (``OTEL_METRICS_EXEMPLAR_FILTER`` is not
        ``always_off``): then the request histograms name their request in their exemplars."""
        return self.enabled and self.exemplar_filter != EXEMPLARS_ALWAYS_OFF


def _endpoint_from(env: Mapping[str, str]) -> str:
    if env is os.environ:
        return config.endpoint()
    value = env.get(config.ENV_ENDPOINT, "").strip()
    return value.rstrip("/") if value.startswith(("http://", "https://")) else config.DEFAULT_ENDPOINT
