"""``sidecar serve --alert-actions FILE``: an action file parsed once, every bad value named as
``[i].field`` (and a bad file stops the start, exit status 2); how an action matches; which alerts
``OwnServer`` takes for this server's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sidecar.service.incidents.alert_actions import OwnServer, parse_alert_actions_file, split_instance
from sidecar.service.jobs.params import ParamError

GOOD = {"match": {"alertname": "InferenceTimeToFirstTokenHigh"},
        "action": {"capture_steps": 5, "recorder_seconds": 60}, "cooldown_s": 300, "budget_per_hour": 4}


def test_a_good_file_and_its_defaults():
    first, second = parse_alert_actions_file(json.dumps([GOOD, {"match": {}}]), 50)
    assert first.to_json() == {"match": {"alertname": "InferenceTimeToFirstTokenHigh"},
                               "action": {"capture_steps": 5, "recorder_seconds": 60.0, "sync_scan": False},
                               "cooldown_s": 300.0, "budget_per_hour": 4}
    assert second.to_json() == {"match": {}, "action": {"capture_steps": 5, "recorder_seconds": 60.0, "sync_scan": False},
                                "cooldown_s": 300.0, "budget_per_hour": 4}
    assert first.matches({"alertname": "InferenceTimeToFirstTokenHigh", "severity": "warning"})
    assert not first.matches({"alertname": "InferenceQueueTimeHigh"}) and not first.matches({})
    assert second.matches({}) and second.matches({"anything": "x"})
    (absent,) = parse_alert_actions_file(json.dumps([{"match": {"pod": ""}}]), 50)
    assert absent.matches({"alertname": "x"}) and not absent.matches({"pod": "p"}), "'' is a label the alert lacks"


@pytest.mark.parametrize("body, param", [
    ("not json", "actions"),
    ({"match": {}}, "actions"),
    ([GOOD, "x"], "[1]"),
    ([GOOD, {**GOOD, "when": 1}], "[1].when"),
    ([{k: v for k, v in GOOD.items() if k != "match"}], "[0].match"),
    ([{**GOOD, "match": ["alertname"]}], "[0].match"),
    ([{**GOOD, "match": {"severity": 2}}], "[0].match.severity"),
    ([{**GOOD, "action": {"capture_steps": 51}}], "[0].action.capture_steps"),
    ([{**GOOD, "action": {"capture_steps": 0, "recorder_seconds": 0}}], "[0].action"),
    ([{**GOOD, "action": {"scan": True}}], "[0].action.scan"),
    ([GOOD, GOOD, {**GOOD, "cooldown_s": 0}], "[2].cooldown_s"),
    ([{**GOOD, "budget_per_hour": 1.5}], "[0].budget_per_hour"),
    ([GOOD] * 101, "actions"),
])
def test_every_bad_value_is_named(body, param):
    with pytest.raises(ParamError) as err:
        parse_alert_actions_file(body if isinstance(body, str) else json.dumps(body), 50)
    assert err.value.param == param, err.value


def test_serve_stops_at_a_bad_file_with_status_2_naming_the_field(tmp_path):
    bad = tmp_path / "actions.json"
    bad.write_text(json.dumps([GOOD, {**GOOD, "match": {"severity": 3}}]))
    env = {k: v for k, v in os.environ.items() if k != "SIDECAR_TOKEN"}
    env["SIDECAR_TOKEN_FILE"] = str(tmp_path / "token")
    result = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", "0", "--trace-dir",
                             str(tmp_path / "traces"), "--alert-actions", str(bad)],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2, result.stderr
    assert f"--alert-actions {bad}: [1].match.severity: must be a string" in result.stderr
    result = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", "0", "--trace-dir",
                             str(tmp_path / "traces"), "--alert-instance", "has space:80"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "--alert-instance" in result.stderr, result.stderr


def test_the_serve_helper_reads_and_names_the_file(tmp_path):
    from sidecar.cli.serve import _alert_actions

    good = tmp_path / "good.json"
    good.write_text(json.dumps([GOOD]))
    assert len(_alert_actions(good, 50)) == 1 and _alert_actions(None, 50) == []
    with pytest.raises(ValueError, match="cannot be read"):
        _alert_actions(tmp_path / "missing.json", 50)


def test_which_alerts_are_this_servers():
    own = OwnServer.of_this_host(env={"POD_NAME": "vllm-0", "POD_IP": "10.0.3.9"})
    reached = ("10.0.3.9", 8787)
    assert own.other_server({}, reached) is None, "no label names another server"
    assert own.other_server({"pod": "vllm-0", "instance": "elsewhere:1"}, reached) is None, "the pod decides"
    assert "pod 'vllm-1'" in own.other_server({"pod": "vllm-1"}, reached)
    assert own.other_server({"instance": "10.0.3.9:8787"}, reached) is None
    assert own.other_server({"instance": "10.0.3.9"}, reached) is None, "an instance without a port"
    assert own.other_server({"instance": "127.0.0.1:8787"}, ("127.0.0.1", 8787)) is None
    assert own.other_server({"instance": "10.0.3.9:9090"}, reached) is not None, "another port"
    assert own.other_server({"instance": "10.0.3.7:8787"}, reached) is not None
    named = OwnServer.of_this_host(["sidecar:8787"], env={})
    assert named.other_server({"instance": "sidecar:8787"}, reached) is None
    assert named.other_server({"instance": "10.0.3.9:8787"}, reached) is not None, "given names replace the derived"
    assert split_instance("[::1]:8787") == ("::1", "8787") and split_instance("Host.:80") == ("host", "80")
    assert split_instance("::1") == ("::1", None)
