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
