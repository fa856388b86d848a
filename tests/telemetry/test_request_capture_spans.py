"""A span leads to its trace: a request that asked to be captured names its capture on its span (or why
it has none), on vLLM's real OutputProcessor and the stat logger; the capture's span links to the
request's span as the captured request, once, and names it."""

import time
from types import SimpleNamespace

from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.metrics.stats import IterationStats

from sidecar.probe.request_capture import CaptureOutcome
from sidecar.common.protocol import CaptureReport, Verdict
from sidecar.telemetry import CaptureSpans, InFlightRequests
from sidecar.telemetry.capture import BoundRequest
from sidecar_vllm.request_capture import CAPTURED
from sidecar_vllm.stat_logger import IN_FLIGHT_ATTR, SidecarStatLogger, install_request_hooks

from .helpers import in_memory_telemetry

CONFIG = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny", model="/models/tiny"))
CAPTURE_ID = "20261123-070102-9c1d2e"


def _add(processor: OutputProcessor, external_id: str, outcome: CaptureOutcome | None) -> str:
    params = SamplingParams(max_tokens=2, output_kind=RequestOutputKind.DELTA, detokenize=False)
    internal_id = f"{external_id}-0"
    request = EngineCoreRequest(request_id=internal_id, prompt_token_ids=[1, 2, 3], mm_features=None,
                                sampling_params=params, pooling_params=None, arrival_time=time.time(),
                                lora_request=None, cache_salt=None, data_parallel_rank=None,
                                external_req_id=external_id)
    token = CAPTURED.set(outcome)  # what request_capture.py does around vLLM's first generate step
    try:
        processor.add_request(request, prompt=None)
    finally:
        CAPTURED.reset(token)
    return internal_id


def test_the_request_span_names_its_capture_or_why_it_has_none():
    install_request_hooks()
    telemetry, exporter, _ = in_memory_telemetry()
    logger = SidecarStatLogger(CONFIG, [0], telemetry=telemetry)
    processor = OutputProcessor(None, log_stats=True)
    processor.__dict__[IN_FLIGHT_ATTR] = InFlightRequests()  # span ids chosen on arrival, as with span export on
    captured = CaptureOutcome(capture_id=CAPTURE_ID, url=f"http://127.0.0.1:8787/profile/{CAPTURE_ID}")
    skipped = CaptureOutcome(skipped=f"busy: capture {CAPTURE_ID} is capturing")
    ids = [_add(processor, "cmpl-a", captured), _add(processor, "cmpl-b", skipped), _add(processor, "cmpl-c", None)]
    assert captured.span_context is not None, "the request's span ids are handed back for the capture's link"
    for finish in (None, FinishReason.LENGTH):
        stats = IterationStats()
        processor.process_outputs([EngineCoreOutput(request_id=i, new_token_ids=[5], finish_reason=finish) for i in ids],
                                  engine_core_timestamp=time.monotonic(), iteration_stats=stats)
        logger.record(None, stats)
    telemetry.span_processor.force_flush()
    roots = {s.attributes["gen_ai.response.id"]: s for s in exporter.get_finished_spans() if s.parent is None}
    a, b, c = roots["cmpl-a"], roots["cmpl-b"], roots["cmpl-c"]
    assert a.attributes["sidecar.capture.id"] == CAPTURE_ID
    assert a.attributes["sidecar.capture.url"] == f"http://127.0.0.1:8787/profile/{CAPTURE_ID}"
    assert "sidecar.capture.skipped" not in a.attributes
    assert a.context.span_id == captured.span_context.span_id
    assert b.attributes["sidecar.capture.skipped"].startswith("busy: capture")
    assert "sidecar.capture.id" not in b.attributes
    assert not any(k.startswith("sidecar.capture.") for k in c.attributes)
    telemetry.shutdown()


def test_the_capture_span_links_to_the_request_it_captured_once():
    telemetry, exporter, _ = in_memory_telemetry()
    in_flight = InFlightRequests()
    request = in_flight.begin("cmpl-a-0")
    other = in_flight.begin("cmpl-b-0")
    captures = CaptureSpans(telemetry.tracer, in_flight, "http://127.0.0.1:8787")
    captures.bind_request(CAPTURE_ID, BoundRequest("cmpl-a", request))
    captures.on_report(CaptureReport(job_id=CAPTURE_ID, state="capturing"))
    captures.on_report(CaptureReport(job_id=CAPTURE_ID, state="exporting"))
    captures.on_report(CaptureReport(job_id=CAPTURE_ID, state="done"))
    captures.on_report(Verdict(job_id=CAPTURE_ID, state="done", steps=8, processes=3, trace_bytes=10,
                               trace=f"/profile/{CAPTURE_ID}/trace"))
    captures.join()
    telemetry.span_processor.force_flush()
    (span,) = exporter.get_finished_spans()
    links = {link.context.span_id: dict(link.attributes) for link in span.links}
    assert links == {request.span_id: {"sidecar.link": "captured_request"},
                     other.span_id: {"sidecar.link": "request_in_flight"}}
    assert span.attributes["sidecar.capture.request_id"] == "cmpl-a"
    assert span.attributes["sidecar.capture.linked_requests"] == 2
    telemetry.shutdown()
