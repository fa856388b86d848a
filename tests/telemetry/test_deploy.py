"""docker-compose.yml, the Prometheus and collector configs, and the Grafana dashboards, checked by the
validators that run here (no Docker engine, no Grafana, no collector binary on these machines)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = shutil.which(name) or (str(BIN / name) if (BIN / name).exists() else None)
    assert path, f"{name} not found: run scripts/install-test-backends.sh"
    return path


def test_compose_file_matches_the_compose_specification():
    result = subprocess.run([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
                             str(ROOT / "docker-compose.yml")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_services_and_mounted_files():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"vllm", "sidecar", "otel-collector", "jaeger", "prometheus", "grafana"} <= set(services)
    assert services["jaeger"]["image"].startswith("jaegertracing/jaeger:2.")
    env = services["vllm"]["environment"]
    assert env["SIDECAR_ENDPOINT"] == "http://sidecar:8787"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://otel-collector:4318")
    # The probes write their raw traces under SIDECAR_TRACE_DIR; the sidecar reads them there: one volume.
    assert env["SIDECAR_TRACE_DIR"] == services["sidecar"]["environment"]["SIDECAR_TRACE_DIR"] == "/traces"
    assert "traces:/traces" in services["vllm"]["volumes"] and "traces:/traces" in services["sidecar"]["volumes"]
    for service in services.values():  # every bind-mounted file exists in the repository
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
    assert (ROOT / "Dockerfile").is_file()


def test_prometheus_config_passes_promtool():
    # --syntax-only: the token file it names exists only inside the Prometheus container.
    result = subprocess.run([_tool("promtool"), "check", "config", "--syntax-only", str(ROOT / "deploy/prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load((ROOT / "deploy/prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["sidecar:8787"] and job["metrics_path"] == "/metrics"


def test_collector_pipelines_reference_defined_components():
    config = yaml.safe_load((ROOT / "deploy/otel-collector.yaml").read_text())
    for pipeline in config["service"]["pipelines"].values():
        for kind in ("receivers", "processors", "exporters"):
            for name in pipeline.get(kind, []):
                assert name in config[kind], f"{kind}: {name}"
    for name in config["service"].get("extensions", []):
        assert name in config["extensions"]
    assert config["exporters"]["otlp/jaeger"]["endpoint"] == "jaeger:4317"


def test_dashboard_json_is_generated_and_matches_grafanas_schema():
    result = subprocess.run([sys.executable, str(ROOT / "dashboards/generate.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    schema = json.loads((ROOT / "dashboards/schema/dashboard-11.6.schema.json").read_text())
    # Grafana's AnnotationQuery (@grafana/data) lets a datasource plugin put its own keys on the annotation;
    # the schema made from @grafana/schema does not. Allow exactly the Prometheus plugin's keys, typed.
    schema["definitions"]["AnnotationQuery"]["properties"].update(
        {key: {"type": "string"} for key in ("expr", "step", "titleFormat", "textFormat", "tagKeys")},
        useValueForTime={"type": "boolean"})
    dashboard = json.loads((ROOT / "dashboards/inference-sidecar.json").read_text())
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(dashboard))
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_grafana_provisioning():
    sources = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/datasources.yaml").read_text())
    assert {s["type"] for s in sources["datasources"]} == {"prometheus", "jaeger"}
    providers = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/dashboards.yaml").read_text())
    assert providers["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"


def _dashboard() -> dict:
    return json.loads((ROOT / "dashboards/inference-sidecar.json").read_text())


def test_dashboard_annotates_captures_and_trigger_firings():
    annotations = {a["name"]: a for a in _dashboard()["annotations"]["list"]}
    captures, firings = annotations["Captures"], annotations["Trigger firings"]
    for annotation in (captures, firings):
        assert annotation["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and annotation["enable"]
        assert annotation["step"] == "1m" and annotation["useValueForTime"] is False
    assert captures["expr"].startswith("sum by (state) (increase(sidecar_captures_total[1m])) > 0 or ")
    assert "unless sum by (state) (sidecar_captures_total offset 1m)" in captures["expr"]
    assert "{{state}}" in captures["titleFormat"] and "{{state}}" in captures["textFormat"]
    assert captures["tagKeys"] == "state"
    assert firings["expr"].startswith(
        'sum by (trigger) (increase(sidecar_trigger_firings_total{outcome="fired"}[1m])) > 0 or ')
    assert "{{trigger}}" in firings["titleFormat"] and "{{trigger}}" in firings["textFormat"]
    assert firings["tagKeys"] == "trigger"


def test_latency_panels_link_to_jaegers_search_for_the_engine_service():
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["jaeger_url"]["type"] == "textbox" and variables["jaeger_url"]["query"] == "http://localhost:16686"
    # The engine's service.name in Jaeger is the compose file's OTEL_SERVICE_NAME.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert variables["jaeger_service"]["query"] == compose["services"]["vllm"]["environment"]["OTEL_SERVICE_NAME"]
    assert "16686:16686" in compose["services"]["jaeger"]["ports"]
    search = ("${jaeger_url:raw}/search?service=${jaeger_service}&lookback=custom"
              "&start=${__from}000&end=${__to}000&limit=100")
    panels = {p["title"]: p for p in dashboard["panels"]}
    slower = {"Time to first token": "&minDuration=${__value.raw}s", "End-to-end latency": "&minDuration=${__value.raw}s",
              "Queue time": "&operation=queue&minDuration=${__value.raw}s", "Time per output token": None}
    for title, params in slower.items():
        panel = panels[title]
        urls = [link["url"] for link in panel["fieldConfig"]["defaults"]["links"]]
        assert search in urls, title
        if params:
            assert search + params in urls, title
        assert all(set(link) == {"title", "url", "targetBlank"} for link in panel["fieldConfig"]["defaults"]["links"])
        assert all(t["exemplar"] is True and "_bucket[" in t["expr"] for t in panel["targets"]), title


def test_incident_panels_query_the_engine_state_gauges_and_trigger_firings():
    exprs = {p["title"]: [t["expr"] for t in p.get("targets", [])] for p in _dashboard()["panels"]}
    assert exprs["Requests in flight"] == ["sum(sidecar_requests_in_flight)"]
    assert exprs["Oldest request age"] == ["max(sidecar_request_oldest_age_seconds)"]
    assert exprs["Engine step running / stuck"] == ["max by (process) (sidecar_engine_step_running_seconds)",
                                                    "max by (process) (sidecar_engine_step_stuck)"]
    assert exprs["Trigger firings"] == [
        "sum by (trigger, outcome) (rate(sidecar_trigger_firings_total[$__rate_interval]))"]
