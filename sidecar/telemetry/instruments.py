"""Metric instruments, their names and bucket boundaries: a stable interface (docs/telemetry.md).

The three ``gen_ai.server.*`` histograms follow the OpenTelemetry GenAI semantic conventions, with the
explicit bucket boundaries the conventions prescribe. Names this package adds live under
``sidecar.*``. Nothing here holds global state: every instrument is created on the Meter passed in.

Exemplars: the four request latency histograms are recorded with one more attribute,
``EXEMPLAR_REQUEST_ID`` (the request's id), which ``request_views`` keep off the series: the SDK puts
an attribute a View drops into the exemplar's ``filtered_attributes``, so each exemplar names its
request and no series gains a label (nor the histogram a series per request).
"""

from __future__ import annotations

from opentelemetry.metrics import Meter
from opentelemetry.sdk.metrics.view import View

# -- names ------------------------------------------------------------------------------------------
GEN_AI_SERVER_REQUEST_DURATION = "gen_ai.server.request.duration"
GEN_AI_SERVER_TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
REQUEST_QUEUE_TIME = "sidecar.request.queue_time"
REQUESTS = "sidecar.requests"
TOKENS = "sidecar.tokens"
STEP_DURATION = "sidecar.step.duration"
STEP_BATCH_SIZE = "sidecar.step.batch_size"
STEP_TOKENS = "sidecar.step.tokens"
SPANS_DROPPED = "sidecar.telemetry.spans.dropped"
GPU_UTILIZATION = "hw.gpu.utilization"
GPU_MEMORY_USAGE = "hw.gpu.memory.usage"
GPU_MEMORY_LIMIT = "hw.gpu.memory.limit"
GPU_POWER = "hw.power"
GPU_TEMPERATURE = "hw.temperature"
PROCESS_CPU_TIME = "process.cpu.time"
PROCESS_MEMORY_USAGE = "process.memory.usage"

# -- bucket boundaries (seconds unless said otherwise) ---------------------------------------------
# From the GenAI semantic conventions (gen-ai-metrics.md, "ExplicitBucketBoundaries").
REQUEST_DURATION_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92)
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0)
TIME_PER_OUTPUT_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
# Ours. Queue time spans the same range as request duration, plus the sub-10 ms an idle server shows.
QUEUE_TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005) + REQUEST_DURATION_BUCKETS
# Engine steps run from well under a millisecond (tiny models, CPU) to seconds (huge prefills).
STEP_DURATION_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024,
                         2.048, 4.096)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
STEP_TOKENS_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536)

# -- exemplars --------------------------------------------------------------------------------------
# The request histograms: recorded inside their request's span, so their exemplars carry its trace and span ids.
REQUEST_HISTOGRAMS = (GEN_AI_SERVER_REQUEST_DURATION, GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
                      GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, REQUEST_QUEUE_TIME)
# The attributes their series have (requests.py records no other, error.type on the duration only).
REQUEST_SERIES_ATTRIBUTES = frozenset({"gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
                                       "error.type"})
# The measurement attribute that names the request: in exemplars only (an exemplar label request_id at /metrics).
EXEMPLAR_REQUEST_ID = "request_id"


def request_views(meter_name: str) -> list[View]:
    """Views that keep ``EXEMPLAR_REQUEST_ID`` (any attribute but the series') off the request histograms'
    series of ``meter_name``'s instruments: the SDK moves it into their exemplars."""
    return [View(instrument_name=name, meter_name=meter_name, attribute_keys=set(REQUEST_SERIES_ATTRIBUTES))
            for name in REQUEST_HISTOGRAMS]


class RequestInstruments:
    """Per-request metrics, recorded once when a request finishes. ``exemplars``: the histograms are
    recorded in the request span's context and with ``EXEMPLAR_REQUEST_ID``; only on a meter whose
    provider has ``request_views`` (else every request would be a series of its own)."""

    def __init__(self, meter: Meter, *, exemplars: bool = False) -> None:
        self.exemplars = exemplars
        self.duration = meter.create_histogram(
            GEN_AI_SERVER_REQUEST_DURATION, unit="s",
            description="Generative AI server request duration such as time-to-last byte or last output token.",
            explicit_bucket_boundaries_advisory=REQUEST_DURATION_BUCKETS)
        self.time_to_first_token = meter.create_histogram(
            GEN_AI_SERVER_TIME_TO_FIRST_TOKEN, unit="s",
            description="Time to generate first token for successful responses.",
            explicit_bucket_boundaries_advisory=TIME_TO_FIRST_TOKEN_BUCKETS)
        self.time_per_output_token = meter.create_histogram(
            GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN, unit="s",
            description="Time per output token generated after the first token for successful responses.",
            explicit_bucket_boundaries_advisory=TIME_PER_OUTPUT_TOKEN_BUCKETS)
        self.queue_time = meter.create_histogram(
            REQUEST_QUEUE_TIME, unit="s",
            description="Time a request waited in the engine's queue before it was first scheduled.",
            explicit_bucket_boundaries_advisory=QUEUE_TIME_BUCKETS)
        self.requests = meter.create_counter(
            REQUESTS, unit="{request}", description="Requests finished by the engine, failed and aborted ones included.")
        self.tokens = meter.create_counter(
            TOKENS, unit="{token}", description="Tokens processed, by gen_ai.token.type (input, output).")


class StepInstruments:
    """Per-step metrics of an engine or worker process (recorded off the step path, see steps.py)."""

    def __init__(self, meter: Meter) -> None:
        self.duration = meter.create_histogram(
            STEP_DURATION, unit="s", description="Duration of one engine or worker step that did work.",
            explicit_bucket_boundaries_advisory=STEP_DURATION_BUCKETS)
        self.batch_size = meter.create_histogram(
            STEP_BATCH_SIZE, unit="{request}", description="Requests scheduled in one step.",
            explicit_bucket_boundaries_advisory=BATCH_SIZE_BUCKETS)
        self.tokens = meter.create_histogram(
            STEP_TOKENS, unit="{token}", description="Tokens scheduled in one step.",
            explicit_bucket_boundaries_advisory=STEP_TOKENS_BUCKETS)
