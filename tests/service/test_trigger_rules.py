"""Trigger rules, the histogram window's percentile and the firing limits, without a server."""

import json

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

from sidecar.service.incidents.histogram_window import HistogramWindows, quantile
from sidecar.service.jobs.params import ParamError
from sidecar.service.incidents.trigger_limits import FiringLimits
from sidecar.service.incidents.trigger_rules import parse_rule, parse_rules_file

STEP = {"metric": "step_duration", "threshold_ms": 1000}


def test_a_step_rule_takes_the_defaults():
    rule = parse_rule(STEP, max_steps=50)
    assert rule.single_event and rule.cooldown_s == 300 and rule.budget_per_hour == 4
    assert rule.action.capture_steps == 5 and rule.action.recorder_seconds == 60 and not rule.action.sync_scan
    p = parse_rule({"metric": "ttft", "threshold_ms": 500, "percentile": 99}, max_steps=50)
    assert p.percentile == 99 and p.window_s == 60 and p.min_count == 5


@pytest.mark.parametrize("body, param", [
    ([], "body"),
    ({"threshold_ms": 5}, "metric"),
    ({"metric": "latency", "threshold_ms": 5}, "metric"),
    ({"metric": "step_duration"}, "threshold_ms"),
    ({**STEP, "threshold_ms": -1}, "threshold_ms"),
    ({**STEP, "threshold_ms": 0}, "threshold_ms"),
    ({**STEP, "threshold_ms": 1e12}, "threshold_ms"),
    ({**STEP, "threshold_ms": "1000"}, "threshold_ms"),
    ({**STEP, "threshold_ms": True}, "threshold_ms"),
    ({**STEP, "threshold_ms": float("nan")}, "threshold_ms"),
    ({**STEP, "cooldown_s": 0}, "cooldown_s"),
    ({**STEP, "budget_per_hour": 0}, "budget_per_hour"),
    ({**STEP, "budget_per_hour": 1.5}, "budget_per_hour"),
    ({**STEP, "thresold_ms": 5}, "thresold_ms"),
    ({**STEP, "window_s": 60}, "window_s"),
    ({"metric": "ttft", "threshold_ms": 5}, "percentile"),
    ({**STEP, "percentile": 20}, "percentile"),
    ({**STEP, "percentile": 99, "window_s": 1}, "window_s"),
    ({**STEP, "percentile": 99, "min_count": 0}, "min_count"),
    ({**STEP, "action": {"capture_steps": 51}}, "action.capture_steps"),
    ({**STEP, "action": {"capture_steps": 0, "recorder_seconds": 0}}, "action"),
    ({**STEP, "action": {"steps": 3}}, "action.steps"),
    ({**STEP, "action": {"sync_scan": "yes"}}, "action.sync_scan"),
    ({**STEP, "action": []}, "action"),
    ({**STEP, "name": ""}, "name"),
])
def test_every_bad_rule_is_refused_naming_its_field(body, param):
    with pytest.raises(ParamError) as err:
        parse_rule(body, max_steps=50)
    assert err.value.param == param, err.value


def test_a_rules_file_names_the_rule_and_its_field():
    assert len(parse_rules_file(json.dumps([STEP, {**STEP, "threshold_ms": 5}]), 50)) == 2
    with pytest.raises(ParamError) as err:
        parse_rules_file(json.dumps([STEP, {**STEP, "cooldown_s": 0}]), 50)
    assert err.value.param == "rules[1].cooldown_s"
    with pytest.raises(ParamError):
        parse_rules_file("{", 50)


def test_quantile_interpolates_like_prometheus():
    inf = float("inf")
    # 10 events in (0, 100], 10 in (100, 200]: the median is 100, p75 halfway into the second bucket.
    assert quantile(0.5, [100, 200, inf], [10, 10, 0]) == 100
    assert quantile(0.75, [100, 200, inf], [10, 10, 0]) == 150
    assert quantile(0.99, [100, 200, inf], [0, 0, 5]) == 200  # in +Inf: the highest finite bound
    assert quantile(0.5, [100, inf], [0, 0]) is None


def _push(counts, bounds=(0.1, 0.5, 1.0, 2.0), start_ns=1, pid="7"):
    msg = ExportMetricsServiceRequest()
    rm = msg.resource_metrics.add()
    attr = rm.resource.attributes.add()
    attr.key, attr.value.string_value = "process.pid", pid
    metric = rm.scope_metrics.add().metrics.add()
    metric.name, metric.unit = "gen_ai.server.time_to_first_token", "s"
    metric.histogram.aggregation_temporality = 2
    point = metric.histogram.data_points.add()
    point.start_time_unix_nano = start_ns
    point.explicit_bounds.extend(bounds)
    point.bucket_counts.extend(counts)
    point.count = sum(counts)
    return msg


def test_the_window_counts_only_the_events_inside_it():
    windows = HistogramWindows(["gen_ai.server.time_to_first_token"], keep_s=3600)
    name = "gen_ai.server.time_to_first_token"
    windows.add(_push([100, 0, 0, 0, 0]), now=1000.0)  # old fast requests (the process started long ago)
    windows.add(_push([100, 0, 0, 0, 0]), now=1050.0)
    windows.add(_push([100, 0, 0, 10, 0]), now=1100.0)  # ten between 1 and 2 s, in the last minute
    got = windows.percentile(name, 99, 60, now=1100.0)
    assert got.count == 10 and 1900 <= got.value_ms <= 2000
    # Over a long window the fast ones dominate the median.
    assert windows.percentile(name, 50, 3600, now=1100.0).value_ms < 100
    # Two processes are summed; a restarted series (counts went down) counts from zero.
    windows.add(_push([0, 0, 0, 0, 2], pid="8", start_ns=int(1090e9)), now=1100.0)
    assert windows.percentile(name, 99, 60, now=1100.0).count == 12
    windows.add(_push([0, 0, 1, 0, 0], start_ns=int(1104e9)), now=1105.0)
    assert windows.percentile(name, 99, 60, now=1105.0).count == 3


def test_cooldown_and_budget():
    limits = FiringLimits(cooldown_s=10, budget_per_hour=2)
    assert limits.refusal(0) is None
    limits.record(0)
    assert limits.refusal(5) == "cooldown"
    assert limits.refusal(11) is None
    limits.record(11)
    assert limits.refusal(30) == "budget"
    assert limits.refusal(3601) is None  # the first firing has left the hour
    with pytest.raises(ValueError):
        FiringLimits(cooldown_s=0, budget_per_hour=1)


def test_serve_refuses_a_bad_rules_file_naming_the_rule_and_field(tmp_path):
    from sidecar.cli.serve import _trigger_rules

    good = tmp_path / "good.json"
    good.write_text(json.dumps([STEP]))
    assert len(_trigger_rules(good, 50)) == 1 and _trigger_rules(None, 50) == []
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([STEP, {**STEP, "budget_per_hour": 0}]))
    with pytest.raises(ValueError, match=r"rules\[1\]\.budget_per_hour"):
        _trigger_rules(bad, 50)
    with pytest.raises(ValueError, match="cannot be read"):
        _trigger_rules(tmp_path / "missing.json", 50)
