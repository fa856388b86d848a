"""The vLLM stat logger on vLLM's real OutputProcessor and IterationStats (no server started).

Engine-core outputs are built by hand with the engine's monotonic timestamps, exactly as the engine
core sends them; everything after that (request state, stats, the patches, record()) is vLLM's code
and ours. The end-to-end run against a live server is tests/e2e (see docs/telemetry.md).
"""

import time
from types import SimpleNamespace

from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, EngineCoreRequest, FinishReason
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.metrics.stats import IterationStats

from sidecar_vllm.stat_logger import _TRACE_HEADERS, SidecarStatLogger, install_request_hooks

from .helpers import in_memory_telemetry, metric_points

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CONFIG = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny", model="/models/tiny"))


def _add(processor: OutputProcessor, external_id: str, headers=None) -> str:
    params = SamplingParams(max_tokens=3, temperature=0.5, top_p=0.8, output_kind=RequestOutputKind.DELTA,
                            detokenize=False)
    internal_id = f"{external_id}-0"
    request = EngineCoreRequest(request_id=internal_id, prompt_token_ids=[1, 2, 3, 4], mm_features=None,
                                sampling_params=params, pooling_params=None, arrival_time=time.time(),
                                lora_request=None, cache_salt=None, data_parallel_rank=None,
                                external_req_id=external_id)
    token = _TRACE_HEADERS.set(headers)  # what the AsyncLLM.add_request patch does around this call
    try:
        processor.add_request(request, prompt=None)
    finally:
        _TRACE_HEADERS.reset(token)
    return internal_id


def _step(processor, logger, outputs, engine_ts):
    stats = IterationStats()
    processor.process_outputs(outputs, engine_core_timestamp=engine_ts, iteration_stats=stats)
    logger.record(None, stats)
    return stats


def test_finished_and_aborted_requests_become_span_trees():
    install_request_hooks()
    install_request_hooks()  # idempotent: vLLM may build several loggers
    telemetry, exporter, reader = in_memory_telemetry()
    logger = SidecarStatLogger(CONFIG, [0], telemetry=telemetry)
    processor = OutputProcessor(None, log_stats=True)
    done = _add(processor, "cmpl-done", {"traceparent": TRACEPARENT})
    aborted = _add(processor, "chatcmpl-gone")
    t0 = time.monotonic()
    time.sleep(0.05)  # the engine's timestamps below are then all in the past, as in a real server
    queued = [EngineCoreEvent.new_event(EngineCoreEventType.QUEUED, t0),
              EngineCoreEvent.new_event(EngineCoreEventType.SCHEDULED, t0 + 0.010)]
    _step(processor, logger, [EngineCoreOutput(request_id=done, new_token_ids=[5], events=queued),
                              EngineCoreOutput(request_id=aborted, new_token_ids=[5], events=list(queued))], t0 + 0.020)
    processor.abort_requests(["chatcmpl-gone"], internal=False)
    _step(processor, logger, [EngineCoreOutput(request_id=done, new_token_ids=[6])], t0 + 0.030)
    _step(processor, logger, [EngineCoreOutput(request_id=done, new_token_ids=[7], finish_reason=FinishReason.LENGTH)],
          t0 + 0.040)
    telemetry.span_processor.force_flush()
    spans = exporter.get_finished_spans()
    roots = {s.name: s for s in spans if s.parent is None or s.parent.is_remote}
    assert set(roots) == {"text_completion tiny", "chat tiny"}
    done_span, gone_span = roots["text_completion tiny"], roots["chat tiny"]
    assert format(done_span.context.trace_id, "032x") == TRACEPARENT.split("-")[1]
    assert done_span.attributes["gen_ai.usage.output_tokens"] == 3
    assert done_span.attributes["gen_ai.usage.input_tokens"] == 4
    assert done_span.attributes["gen_ai.request.max_tokens"] == 3
    assert done_span.attributes["gen_ai.request.temperature"] == 0.5
    assert done_span.attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert done_span.attributes["gen_ai.provider.name"] == "vllm"  # VLLM_PROFILE.provider
    assert gone_span.attributes["error.type"] == "aborted"
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == done_span.context.span_id}
    assert set(children) == {"queue", "prefill", "decode"}
    ms = 1e6
    assert abs(children["queue"].end_time - children["queue"].start_time - 10 * ms) < 0.01 * ms
    assert abs(children["prefill"].end_time - children["prefill"].start_time - 10 * ms) < 0.01 * ms
    assert abs(children["decode"].end_time - children["decode"].start_time - 20 * ms) < 0.01 * ms
    [tpot] = metric_points(reader, "gen_ai.server.time_per_output_token")
    assert tpot.count == 1 and abs(tpot.sum - 0.010) < 1e-6
    requests = {p.attributes.get("error.type"): p.value for p in metric_points(reader, "sidecar.requests")}
    assert requests == {None: 1, "aborted": 1}


def test_the_loggers_own_telemetry_is_named_by_the_vllm_profile(monkeypatch):
    for name, value in {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "SIDECAR_METRICS_PUSH": "0",
                        "SIDECAR_TELEMETRY": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    for env_name, expected in ((None, "vllm"), ("my-service", "my-service")):
        if env_name:
            monkeypatch.setenv("OTEL_SERVICE_NAME", env_name)
        logger = SidecarStatLogger(CONFIG, [0])
        try:
            attrs = logger.telemetry.resource.attributes
            assert attrs["service.name"] == expected and attrs["sidecar.process.role"] == "api_server"
        finally:
            logger.telemetry.shutdown()
