"""The Prometheus alert rules (deploy/alerts.yml, docs/alerting.md), checked and unit-tested by promtool,
and loaded by deploy/prometheus.yml both in the repository and in the compose file's Prometheus."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "alerts.yml"
RULE_TESTS = DEPLOY / "alerts_test.yml"
CONFIG = DEPLOY / "prometheus.yml"
SEVERITIES = {"critical", "warning", "info"}


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, ("promtool not found: it comes with Prometheus. Run scripts/install-test-backends.sh, "
                  "or `sudo apt-get install -y --no-install-recommends prometheus` (Debian/Ubuntu), or put the "
                  "promtool of a release from https://prometheus.io/download/ on PATH")
    return path


def _promtool_run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _alerts() -> dict[str, dict]:
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    alerts = {rule["alert"]: rule for rule in rules if "alert" in rule}
    assert len(alerts) == len(rules), "every rule in deploy/alerts.yml is an alert, each with its own name"
    return alerts


def test_rules_pass_promtool_check_rules():
    result = _promtool_run("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout


def test_rules_pass_their_promtool_unit_tests():
    result = _promtool_run("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_has_a_case_where_it_fires_and_one_where_it_does_not():
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = set(_alerts())
    assert not alerts - firing, f"alerts with no test case where they fire: {sorted(alerts - firing)}"
    assert not alerts - quiet, f"alerts with no test case where they stay quiet: {sorted(alerts - quiet)}"
    assert not (firing | quiet) - alerts, f"test cases for unknown alerts: {sorted((firing | quiet) - alerts)}"


def test_every_alert_has_a_severity_a_duration_and_says_its_value():
    for name, rule in _alerts().items():
        assert rule.get("labels", {}).get("severity") in SEVERITIES, name
        assert "for" in rule, f"{name}: say how long the condition must hold, even `for: 0m`"
        annotations = rule.get("annotations", {})
        assert {"summary", "description"} <= set(annotations), name
        assert "$value" in annotations["description"], f"{name}: the description says the value"
        assert "docs/alerting.md" in annotations["description"], name
    documented = (ROOT / "docs/alerting.md").read_text()
    missing = [name for name in _alerts() if f"`{name}`" not in documented]
    assert not missing, f"alerts not in docs/alerting.md: {missing}"


def test_prometheus_config_names_the_rules_relative_to_itself():
    config = yaml.safe_load(CONFIG.read_text())
    found = [path for pattern in config["rule_files"] for path in CONFIG.parent.glob(pattern)]
    assert found == [RULES]
    # Without --syntax-only promtool would also read the token file, which exists only in the container.
    result = _promtool_run("check", "config", "--syntax-only", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_prometheus_loads_the_rules(tmp_path):
    """The Prometheus container's files, laid out as docker-compose.yml mounts them, pass a full
    `promtool check config`, which reads the rule files the config names."""
    service = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["prometheus"]
    config_arg = next(arg for arg in service["command"] if arg.startswith("--config.file="))
    container_config = config_arg.split("=", 1)[1]
    mounted = {}
    for volume in service["volumes"]:
        source, target = volume.split(":")[:2]
        if source.startswith("./"):
            mounted[target] = ROOT / source
    assert mounted.get(container_config) == CONFIG
    for target, source in mounted.items():
        (tmp_path / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, tmp_path / target.lstrip("/"))
    config_path = tmp_path / container_config.lstrip("/")
    config = yaml.safe_load(config_path.read_text())
    token = tmp_path / "run/secrets/sidecar_token"  # the compose secret
    token.parent.mkdir(parents=True)
    token.write_text("0123456789abcdef0123456789abcdef")
    for job in config["scrape_configs"]:
        job["authorization"]["credentials_file"] = str(token)
    config_path.write_text(yaml.safe_dump(config))

    result = _promtool_run("check", "config", str(config_path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in result.stdout, result.stdout
