"""deploy/alertmanager.yml, deploy/alert-actions.json and their place in deploy/prometheus.yml and
docker-compose.yml (docs/alerting.md, "From alert to capture"): amtool checks the configuration and
says where each of the project's alerts goes; the actions file is one the sidecar accepts, about
alerts that exist, and routed to it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from alert_chain import binary
from sidecar.common.config import DEFAULT_MAX_STEPS
from sidecar.service.incidents.alert_actions import parse_alert_actions_file

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CONFIG = DEPLOY / "alertmanager.yml"


def _amtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary("amtool"), *args], capture_output=True, text=True, timeout=60)


def _alert_names() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"]]


def test_amtool_accepts_the_configuration():
    result = _amtool("check-config", str(CONFIG))
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr


def test_the_engine_alerts_reach_the_sidecar_and_every_alert_the_pager():
    for name in _alert_names():
        result = _amtool("config", "routes", "test", f"--config.file={CONFIG}", f"alertname={name}",
                         "instance=sidecar:8787", "severity=warning")
        assert result.returncode == 0, result.stderr
        receivers = set(result.stdout.strip().split(","))
        want = {"sidecar", "page"} if name.startswith("Inference") else {"page"}
        assert receivers == want, (name, result.stdout)


def test_the_webhook_is_the_sidecars_with_its_token_and_resolved_alerts():
    config = yaml.safe_load(CONFIG.read_text())
    [receiver] = [r for r in config["receivers"] if r["name"] == "sidecar"]
    [webhook] = receiver["webhook_configs"]
    assert webhook["url"] == "http://sidecar:8787/alerts" and webhook["send_resolved"] is True
    assert webhook["http_config"]["authorization"] == {"type": "Bearer", "credentials_file": "/run/secrets/sidecar_token"}
    [route] = [r for r in config["route"]["routes"] if r["receiver"] == "sidecar"]
    assert route["continue"] is True and route["group_by"] == ["alertname", "instance"]


def test_the_actions_file_is_valid_and_names_routed_alerts():
    actions = parse_alert_actions_file((DEPLOY / "alert-actions.json").read_text(), DEFAULT_MAX_STEPS)
    names = {dict(a.match)["alertname"] for a in actions}
    assert names <= set(_alert_names()), names - set(_alert_names())
    assert names == {n for n in _alert_names() if n.startswith("Inference")}, "every alert routed to the sidecar has an action"
    stuck = {"InferenceEngineStepStuck", "InferenceGPUIdleWhileRequestsWait", "InferenceRequestStalled"}
    for action in actions:  # a stuck engine takes no steps: a capture would only wait for them
        assert (action.action.capture_steps == 0) == (dict(action.match)["alertname"] in stuck), action


def test_prometheus_and_compose_run_alertmanager_beside_the_sidecar():
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = [t for am in prometheus["alerting"]["alertmanagers"] for c in am["static_configs"] for t in c["targets"]]
    assert targets == ["alertmanager:9093"]
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    am = services["alertmanager"]
    assert "./deploy/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro" in am["volumes"]
    assert am["secrets"] == ["sidecar_token"] and "alertmanager" in services["prometheus"]["depends_on"]
    sidecar = services["sidecar"]["entrypoint"]
    actions_path = sidecar[sidecar.index("--alert-actions") + 1]
    assert f"./deploy/alert-actions.json:{actions_path}:ro" in services["sidecar"]["volumes"]
    # Prometheus scrapes the sidecar as sidecar:8787: the instance label its alerts carry.
    assert sidecar[sidecar.index("--alert-instance") + 1] == prometheus["scrape_configs"][0]["static_configs"][0]["targets"][0]
