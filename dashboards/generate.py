"""Grafana dashboards as code (grafana-foundation-sdk). Run: python dashboards/generate.py

Writes ``dashboards/inference-sidecar.json``, which is committed and provisioned by deploy/grafana.
Every query uses the Prometheus names the sidecar's /metrics serves (docs/telemetry.md);
tests/telemetry/test_prometheus.py runs them, the annotation queries included, against a real Prometheus.

The latency panels link to Jaeger's trace search (the engine's service, the dashboard's time range,
a minimum duration where the panel's value bounds the request) and show exemplars, each linking to its
request's trace through the Prometheus data source's ``exemplarTraceIdDestinations``
(deploy/grafana/provisioning/datasources/datasources.yaml); the time axis carries annotations for
captures and trigger firings.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (DashboardCursorSync, DashboardLinkType, DataSourceRef,
                                                     DynamicConfigValue)

OUT = Path(__file__).with_name("inference-sidecar.json")
UID = "inference-sidecar"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"

# Jaeger: its UI's base URL and the engine's service.name (OTEL_SERVICE_NAME in docker-compose.yml, the
# engine profile's service_name), both dashboard variables. Jaeger's search page takes start and end in
# microseconds (Grafana's ${__from} and ${__to} are milliseconds: hence the appended 000), lookback=custom
# to use them, and a minimum duration as a number with a unit (us, ms, s, m, h).
JAEGER_URL_VAR, JAEGER_SERVICE_VAR = "jaeger_url", "jaeger_service"
JAEGER_URL_DEFAULT, JAEGER_SERVICE_DEFAULT = "http://localhost:16686", "vllm"
JAEGER_SEARCH = (f"${{{JAEGER_URL_VAR}:raw}}/search?service=${{{JAEGER_SERVICE_VAR}}}&lookback=custom"
                 "&start=${__from}000&end=${__to}000&limit=100")

# Annotations on the time axis. A counter's first sample in a state (a capture state or a trigger seen for
# the first time, e.g. the first capture after the sidecar started) has no earlier sample for increase()
# to compare with: the second branch catches a series that exists now and did not a minute ago.
ANNOTATION_WINDOW = "1m"


def _changed(selector: str, by: str) -> str:
    window = ANNOTATION_WINDOW
    return (f"sum by ({by}) (increase({selector}[{window}])) > 0 "
            f"or (sum by ({by}) ({selector}) unless sum by ({by}) ({selector} offset {window}))")


# name -> (expr, title, text, colour). Grafana's Prometheus annotations read titleFormat, textFormat,
# tagKeys, step and useValueForTime from the annotation itself (the SDK models only expr): render() adds them.
ANNOTATIONS = {
    "Captures": (_changed("sidecar_captures_total", "state"), "capture {{state}}",
                 "A profiler capture finished: {{state}}", "purple"),
    "Trigger firings": (_changed('sidecar_trigger_firings_total{outcome="fired"}', "trigger"),
                        "trigger {{trigger}} fired", "Trigger {{trigger}} fired (GET /triggers/{{trigger}} for its rule)",
                        "red"),
}
ANNOTATION_TAGS = {"Captures": "state", "Trigger firings": "trigger"}


def _query(expr: str, legend: str, ref: str, exemplar: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)
    return query.exemplar(True) if exemplar else query


def _series(title: str, unit: str, queries: list[tuple[str, str]], description: str = "",
            width: int = 8, exemplar: bool = False) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .height(8).span(width).fill_opacity(10).line_width(1))
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i), exemplar))
    return panel


def _jaeger_link(title: str, params: str = "") -> dashboard.DashboardLink:
    # A data link (field config links): render() keeps only the data-link fields.
    return (dashboard.DashboardLink(title).type(DashboardLinkType.LINK).url(JAEGER_SEARCH + params)
            .target_blank(True))


def _latency(title: str, metric: str, description: str, min_duration: str | None) -> timeseries.Panel:
    """A latency panel (p50/p90/p99, exemplars on) whose points link to the traces in Jaeger.

    ``min_duration``: the search parameters that make the clicked value a minimum (None where the
    panel's value bounds no span, e.g. time per output token)."""
    links = [_jaeger_link("Jaeger: traces in this time range")]
    if min_duration is not None:
        links.insert(0, _jaeger_link("Jaeger: traces at least this slow in this time range", min_duration))
    return _series(title, "s", _quantiles(metric), description, exemplar=True).data_links(links)


def _quantiles(metric: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le, {by}" if by else "le"
    suffix = f" {{{{{by}}}}}" if by else ""
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{RATE}])))", f"p{int(q * 100)}{suffix}")
            for q in (0.5, 0.9, 0.99)]


def build() -> dashboard.Dashboard:
    d = (dashboard.Dashboard("LLM inference: requests, engine steps, GPUs").uid(UID)
         .tags(["inference-sidecar", "vllm", "gen_ai"]).refresh("10s").time("now-30m", "now")
         .timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
         .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
         .with_variable(dashboard.TextBoxVariable(JAEGER_URL_VAR).label("Jaeger UI")
                        .description("Base URL of Jaeger's UI, for the latency panels' trace links.")
                        .default_value(JAEGER_URL_DEFAULT))
         .with_variable(dashboard.TextBoxVariable(JAEGER_SERVICE_VAR).label("Jaeger service")
                        .description("The engine's service.name in Jaeger (OTEL_SERVICE_NAME).")
                        .default_value(JAEGER_SERVICE_DEFAULT)))
    for name, (expr, _title, _text, colour) in ANNOTATIONS.items():
        d = d.annotation(dashboard.AnnotationQuery().name(name).datasource(DATASOURCE).enable(True)
                         .icon_color(colour).expr(expr))

    d = d.with_row(dashboard.Row("Requests"))
    d = d.with_panel(_series("Request rate", "reqps", [
        (f"sum by (gen_ai_request_model) (rate(sidecar_requests_total[{RATE}]))", "{{gen_ai_request_model}}"),
        (f"sum by (error_type) (rate(sidecar_requests_total{{error_type!=\"\"}}[{RATE}]))", "failed: {{error_type}}"),
    ], "Finished requests per second; failed and aborted ones by error.type."))
    # Jaeger's minDuration matches traces with a span of the service at least that long: the request span
    # for TTFT (a request lasts at least its TTFT: the search is a superset) and end-to-end latency, the
    # queue span for queue time. ${__value.raw} is the clicked point's value, in seconds.
    slower = "&minDuration=${__value.raw}s"
    d = d.with_panel(_latency("Time to first token", "gen_ai_server_time_to_first_token_seconds",
                              "gen_ai.server.time_to_first_token: arrival to first token, successful requests. "
                              "Click a point for Jaeger's requests at least that long.", slower))
    d = d.with_panel(_latency("Time per output token", "gen_ai_server_time_per_output_token_seconds",
                              "gen_ai.server.time_per_output_token: decode time per token after the first.", None))
    d = d.with_panel(_latency("End-to-end latency", "gen_ai_server_request_duration_seconds",
                              "gen_ai.server.request.duration: arrival to last output. "
                              "Click a point for Jaeger's requests at least that long.", slower))
    d = d.with_panel(_latency("Queue time", "sidecar_request_queue_time_seconds",
                              "Engine queue: queued to first scheduled. "
                              "Click a point for Jaeger's queue spans at least that long.", "&operation=queue" + slower))
    d = d.with_panel(_series("Tokens per second", "short", [
        (f"sum by (gen_ai_token_type) (rate(sidecar_tokens_total[{RATE}]))", "{{gen_ai_token_type}}"),
    ], "Input (prompt) and output tokens per second."))

    d = d.with_row(dashboard.Row("In flight, stuck steps, triggers"))
    d = d.with_panel(_series("Requests in flight", "short", [
        ("sum(sidecar_requests_in_flight)", "in flight"),
    ], "Requests the engine holds and has not finished (queued, prefill, decode), from the probes' heartbeats "
       "(at most about 2 s old)."))
    d = d.with_panel(_series("Oldest request age", "s", [
        ("max(sidecar_request_oldest_age_seconds)", "oldest"),
    ], "Age of the oldest request in flight (0 with none). Climbing steadily: a request is stuck; "
       "GET /requests lists them."))
    d = d.with_panel(_series("Engine step running / stuck", "s", [
        ("max by (process) (sidecar_engine_step_running_seconds)", "running {{process}}"),
        ("max by (process) (sidecar_engine_step_stuck)", "stuck {{process}}"),
    ], "How long each process's running step had run at its last heartbeat (0 between steps), and 1 while its "
       "step watchdog (SIDECAR_WATCHDOG_S) reports the step stuck (right axis; GET /stacks shows where).")
        .override_by_query("B", [DynamicConfigValue(id_val="unit", value="none"),
                                 DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
                                 DynamicConfigValue(id_val="max", value=1),
                                 DynamicConfigValue(id_val="min", value=0)]))
    d = d.with_panel(_series("Trigger firings", "short", [
        (f"sum by (trigger, outcome) (rate(sidecar_trigger_firings_total[{RATE}]))", "{{trigger}} {{outcome}}"),
    ], "Trigger firings per second, by trigger id and outcome (fired, skipped: cooldown, budget, capture busy)."))

    d = d.with_row(dashboard.Row("Engine steps"))
    d = d.with_panel(_series("Step time", "s", _quantiles("sidecar_step_duration_seconds", "sidecar_process_role"),
                             "Duration of the steps that did work, by process role (vLLM: its workers; a single-process engine: its scheduler)."))
    d = d.with_panel(_series("Batch size", "short", [
        (f"sum by (sidecar_process_role) (rate(sidecar_step_batch_size_sum[{RATE}])) / "
         f"sum by (sidecar_process_role) (rate(sidecar_step_batch_size_count[{RATE}]))", "mean {{sidecar_process_role}}"),
        *_quantiles("sidecar_step_batch_size", "sidecar_process_role")[2:],
    ], "Requests scheduled per step."))
    d = d.with_panel(_series("Tokens per step", "short", [
        (f"sum by (sidecar_process_role) (rate(sidecar_step_tokens_sum[{RATE}])) / "
         f"sum by (sidecar_process_role) (rate(sidecar_step_tokens_count[{RATE}]))", "mean {{sidecar_process_role}}"),
    ], "Tokens scheduled per step."))

    d = d.with_row(dashboard.Row("GPUs and processes"))
    d = d.with_panel(_series("GPU utilisation", "percentunit", [
        ("max by (hw_id, hw_name) (hw_gpu_utilization)", "{{hw_name}} {{hw_id}}")], "NVML utilisation per device."))
    d = d.with_panel(_series("GPU memory", "bytes", [
        ("max by (hw_id) (hw_gpu_memory_usage_bytes)", "used {{hw_id}}"),
        ("max by (hw_id) (hw_gpu_memory_limit_bytes)", "total {{hw_id}}")], "NVML memory used and total per device."))
    d = d.with_panel(_series("GPU power and temperature", "watt", [
        ("max by (hw_id) (hw_power_watts{hw_type=\"gpu\"})", "W {{hw_id}}"),
        ("max by (hw_id) (hw_temperature_celsius{hw_type=\"gpu\"})", "°C {{hw_id}}")], "NVML power draw and temperature."))
    d = d.with_panel(_series("Process CPU", "percentunit", [
        (f"sum by (sidecar_process_role, process_pid) (rate(process_cpu_time_seconds_total[{RATE}]))",
         "{{sidecar_process_role}} {{process_pid}}")], "CPU time per engine process (1.0 = one core)."))
    d = d.with_panel(_series("Process memory (RSS)", "bytes", [
        ("max by (sidecar_process_role, process_pid) (process_memory_usage_bytes)",
         "{{sidecar_process_role}} {{process_pid}}")], "Resident memory per engine process."))

    d = d.with_row(dashboard.Row("Captures and telemetry"))
    d = d.with_panel(_series("Captures", "short", [
        (f"sum by (state) (increase(sidecar_captures_total[{RATE}]))", "{{state}}"),
    ], "Profiler captures finished, by final state."))
    d = d.with_panel(stat.Panel().title("Trace bytes captured").unit("bytes").datasource(DATASOURCE).height(8).span(8)
                     .with_target(_query("sum(sidecar_capture_bytes_total)", "bytes", "A")))
    d = d.with_panel(_series("Capture duration", "s", [
        (f"histogram_quantile(0.5, sum by (le) (rate(sidecar_capture_duration_seconds_bucket[{RATE}])))", "p50"),
        (f"histogram_quantile(0.95, sum by (le) (rate(sidecar_capture_duration_seconds_bucket[{RATE}])))", "p95"),
    ], "Start to final state of the captures that finished (merge and analysis included)."))
    d = d.with_panel(_series("Hidden syncs found", "short", [
        (f"sum by (site, op, phase) (increase(sidecar_sync_site_hits_total{{classification=\"hidden\"}}[{RATE}]))",
         "scan: {{site}} {{op}} ({{phase}})"),
        (f"sum by (site, op, phase) (increase(sidecar_sync_watch_calls_total{{classification=\"hidden\"}}[{RATE}]))",
         "watch: {{site}} {{op}} ({{phase}})"),
    ], "GPU->CPU syncs classed hidden, by code site: found by sync scans, and seen by the always-on watch "
       "(SIDECAR_SYNC_WATCH=1; sampled steps). GET /syncs and /syncs/watch have the details."))
    d = d.with_panel(_series("Spans dropped", "short", [
        (f"sum by (reason) (rate(sidecar_telemetry_spans_dropped_total[{RATE}]))", "{{reason}}"),
    ], "Spans the bounded export queue dropped (backend down or slow)."))
    return d


def render() -> str:
    model = json.loads(JSONEncoder().encode(build().build()))
    # The SDK leaves panel ids unset (rows get 0) and writes the interval-variable fields auto,
    # auto_count, auto_min on every variable; the dashboard schema allows them on neither. Number the
    # panels and keep those fields on interval variables only.
    for number, panel in enumerate(model["panels"], start=1):
        panel["id"] = number
    for variable in model.get("templating", {}).get("list", []):
        if variable.get("type") != "interval":
            for key in ("auto", "auto_count", "auto_min"):
                variable.pop(key, None)
    # The SDK types field-config links as dashboard links; Grafana's data links are {title, url, targetBlank}.
    for panel in model["panels"]:
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        if "links" in defaults:
            defaults["links"] = [{k: link[k] for k in ("title", "url", "targetBlank")} for link in defaults["links"]]
    for annotation in model.get("annotations", {}).get("list", []):
        if annotation["name"] in ANNOTATIONS:
            _expr, title, text, _colour = ANNOTATIONS[annotation["name"]]
            annotation.update(step=ANNOTATION_WINDOW, titleFormat=title, textFormat=text,
                              tagKeys=ANNOTATION_TAGS[annotation["name"]], useValueForTime=False)
    return json.dumps(model, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} is out of date: run python dashboards/generate.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
