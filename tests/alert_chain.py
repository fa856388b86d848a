"""The real alert chain for tests and benchmarks (not a test module): Prometheus evaluating a copy of
deploy/alerts.yml, Debian's Alertmanager (``prometheus-alertmanager``) with the sidecar's route and
receiver of deploy/alertmanager.yml, both on loopback ports, both stopped by ``close``.

- ``alertmanager_config``: deploy/alertmanager.yml as a test runs it: the webhook's URL the test
  sidecar's, its ``credentials_file`` the test's token file (none: no ``http_config``), the sidecar
  route's waits short.
- ``rules_with_short_for``: deploy/alerts.yml with one alert's ``for:`` made short, the rest as they are.
- ``Alertmanager``, ``RulesPrometheus``: the two servers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from sidecar.devtools.stack import free_port

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
INSTALL_HINT = ("run scripts/install-test-backends.sh (or `sudo apt-get install -y --no-install-recommends "
                "prometheus prometheus-alertmanager` on Debian/Ubuntu)")


# The alert actions of the fixture-model stack's sidecar (tests/shared_stacks.py), for
# tests/e2e/test_vllm_triggers_alertmanager.py: the TTFT alert, which a few slow-token prompts
# raise, captures 3 steps.
E2E_ALERT = "InferenceTimeToFirstTokenHigh"
E2E_ALERT_ACTIONS = [{"match": {"alertname": E2E_ALERT}, "action": {"capture_steps": 3, "recorder_seconds": 10},
                      "cooldown_s": 1, "budget_per_hour": 60}]


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise AssertionError(f"{' or '.join(names)} not installed: {INSTALL_HINT}")


def alertmanager_config(webhook_url: str, token_file: Path | None, *, group_wait: str = "0s",
                        group_interval: str = "1s") -> dict[str, Any]:
    """deploy/alertmanager.yml pointed at a test's sidecar."""
    config = yaml.safe_load((DEPLOY / "alertmanager.yml").read_text())
    [sidecar_route] = [r for r in config["route"]["routes"] if r["receiver"] == "sidecar"]
    sidecar_route.update(group_wait=group_wait, group_interval=group_interval)
    [receiver] = [r for r in config["receivers"] if r["name"] == "sidecar"]
    [webhook] = receiver["webhook_configs"]
    webhook["url"] = webhook_url
    if token_file is None:
        webhook.pop("http_config", None)
    else:
        webhook["http_config"]["authorization"]["credentials_file"] = str(token_file)
    return config


def rules_with_short_for(alert: str, for_: str = "2s") -> dict[str, Any]:
    """deploy/alerts.yml with ``alert``'s ``for:`` set to ``for_``."""
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    found = [r for g in rules["groups"] for r in g["rules"] if r.get("alert") == alert]
    assert found, f"no alert {alert} in deploy/alerts.yml"
    found[0]["for"] = for_
    return rules


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class _Server:
    def __init__(self, command: list[str], work_dir: Path, name: str, ready_url: str) -> None:
        self.log_path = work_dir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self._proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self._name = name
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.check()
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        self.close()
        raise AssertionError(f"{name} not ready after 60 s; see {self.log_path}")

    def check(self) -> None:
        if self._proc.poll() is not None:
            raise AssertionError(f"{self._name} exited with {self._proc.returncode}: "
                                 f"{self.log_path.read_text(errors='replace')[-2000:]}")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._log.close()


class Alertmanager(_Server):
    """A real Alertmanager on 127.0.0.1 with ``config``, no cluster, its data in ``work_dir``."""

    def __init__(self, work_dir: Path, config: dict[str, Any]) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        path = work_dir / "alertmanager.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([binary("prometheus-alertmanager", "alertmanager"), f"--config.file={path}",
                          f"--storage.path={work_dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
                          "--cluster.listen-address="], work_dir, "alertmanager", f"{self.url}/-/ready")

    def post_alerts(self, alerts: list[dict[str, Any]]) -> None:
        """Alerts as Prometheus sends them (API v2: labels, annotations, startsAt, endsAt)."""
        req = urllib.request.Request(f"{self.url}/api/v2/alerts", data=json.dumps(alerts).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200, resp.status

    def notifications(self, outcome: str = "failed") -> float:
        """Its own count of webhook notifications ``failed`` (or ``total``)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        name = f"alertmanager_notifications_{outcome}_total"
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + "{") and 'integration="webhook"' in line)


class RulesPrometheus(_Server):
    """A real Prometheus on 127.0.0.1 scraping ``target`` and evaluating ``rules`` every
    ``interval_s``, sending its alerts to ``alertmanager``."""

    def __init__(self, work_dir: Path, target: str, rules: dict[str, Any], alertmanager: Alertmanager,
                 interval_s: float = 1.0) -> None:
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / "alerts.yml").write_text(yaml.safe_dump(rules, sort_keys=False))
        every = f"{round(interval_s * 1000)}ms"
        config = {"global": {"scrape_interval": every, "evaluation_interval": every},
                  "rule_files": ["alerts.yml"],
                  "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager.port}"]}]}]},
                  "scrape_configs": [{"job_name": "inference-sidecar", "static_configs": [{"targets": [target]}]}]}
        path = work_dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__([binary("prometheus"), f"--config.file={path}", f"--storage.tsdb.path={work_dir / 'tsdb'}",
                          f"--web.listen-address=127.0.0.1:{self.port}"], work_dir, "prometheus", f"{self.url}/-/ready")

    def alerts(self) -> list[dict[str, Any]]:
        """Its pending and firing alerts (labels, state, activeAt)."""
        self.check()
        return _get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        self.check()
        return _get_json(f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))["data"]["result"]

