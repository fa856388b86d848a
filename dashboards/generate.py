"""Grafana dashboards as code (grafana-foundation-sdk). Run: python dashboards/generate.py

Writes ``dashboards/inference-sidecar.json``, which is committed and provisioned by deploy/grafana.
Every query uses the Prometheus names the sidecar's /metrics serves (docs/telemetry.md);
tests/telemetry/test_prometheus.py runs them against a real Prometheus.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, DataSourceRef

OUT = Path(__file__).with_name("inference-sidecar.json")
UID = "inference-sidecar"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"


def _query(expr: str, legend: str, ref: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).datasource(DATASOURCE)


def _series(title: str, unit: str, queries: list[tuple[str, str]], description: str = "",
            width: int = 8) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).unit(unit).datasource(DATASOURCE)
             .height(8).span(width).fill_opacity(10).line_width(1))
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_query(expr, legend, chr(ord("A") + i)))
    return panel


def _quantiles(metric: str, by: str = "") -> list[tuple[str, str]]:
    group = f"le, {by}" if by else "le"
    suffix = f" {{{{{by}}}}}" if by else ""
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket[{RATE}])))", f"p{int(q * 100)}{suffix}")
            for q in (0.5, 0.9, 0.99)]


def build() -> dashboard.Dashboard:
    d = (dashboard.Dashboard("LLM inference: requests, engine steps, GPUs").uid(UID)
         .tags(["inference-sidecar", "vllm", "gen_ai"]).refresh("10s").time("now-30m", "now")
         .timezone("browser").tooltip(DashboardCursorSync.CROSSHAIR)
         .with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))

    d = d.with_row(dashboard.Row("Requests"))
    d = d.with_panel(_series("Request rate", "reqps", [
        (f"sum by (gen_ai_request_model) (rate(sidecar_requests_total[{RATE}]))", "{{gen_ai_request_model}}"),
        (f"sum by (error_type) (rate(sidecar_requests_total{{error_type!=\"\"}}[{RATE}]))", "failed: {{error_type}}"),
    ], "Finished requests per second; failed and aborted ones by error.type."))
    d = d.with_panel(_series("Time to first token", "s", _quantiles("gen_ai_server_time_to_first_token_seconds"),
                             "gen_ai.server.time_to_first_token: arrival to first token, successful requests."))
    d = d.with_panel(_series("Time per output token", "s",
                             _quantiles("gen_ai_server_time_per_output_token_seconds"),
                             "gen_ai.server.time_per_output_token: decode time per token after the first."))
    d = d.with_panel(_series("End-to-end latency", "s", _quantiles("gen_ai_server_request_duration_seconds"),
                             "gen_ai.server.request.duration: arrival to last output."))
    d = d.with_panel(_series("Queue time", "s", _quantiles("sidecar_request_queue_time_seconds"),
                             "Engine queue: queued to first scheduled."))
    d = d.with_panel(_series("Tokens per second", "short", [
        (f"sum by (gen_ai_token_type) (rate(sidecar_tokens_total[{RATE}]))", "{{gen_ai_token_type}}"),
    ], "Input (prompt) and output tokens per second."))

    d = d.with_row(dashboard.Row("Engine steps"))
    d = d.with_panel(_series("Step time", "s", _quantiles("sidecar_step_duration_seconds", "sidecar_process_role"),
                             "Duration of engine-core and worker steps that did work."))
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
