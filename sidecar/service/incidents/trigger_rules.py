"""A trigger's rule (docs/api.md, "Triggers"): what to watch, when it breaches, what a firing does, how
often it may. Parsed from JSON here, once; every bad value is a ``ParamError`` naming the field
(``action.capture_steps``; in a rules file, ``rules[2].cooldown_s``), so nothing half-valid is armed.

Two kinds of rule, told apart by ``percentile``:

* a **single event** (no percentile): one step over ``threshold_ms``, the slowest step each heartbeat
  reports, or the step still running (a hung engine); ``step_duration`` only, the one metric whose
  every event the sidecar sees (the others arrive as histograms);
* a **percentile over a window**: the ``percentile``-th of the metric's pushed histograms over the
  last ``window_s``, summed over the processes, once ``min_count`` events are in the window (one slow
  request is no trend).

The limits (``cooldown_s`` ≥ 1, ``budget_per_hour`` ≥ 1) exist so that a sick server is not profiled
to death: 0 for either is refused rather than read as "no limit".
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

from ...common.protocol import MAX_QUERY_SECONDS
from ..jobs.params import ParamError

# The rule's metric names -> the OpenTelemetry histogram the probes push (docs/telemetry.md).
METRICS = {
    "ttft": "gen_ai.server.time_to_first_token",
    "tpot": "gen_ai.server.time_per_output_token",
    "request_duration": "gen_ai.server.request.duration",
    "queue_time": "sidecar.request.queue_time",
    "step_duration": "sidecar.step.duration",
}
SINGLE_EVENT_METRICS = ("step_duration",)
MAX_THRESHOLD_MS = 3_600_000.0  # an hour: more is a typo, never a latency worth watching
MIN_PERCENTILE, MAX_PERCENTILE = 50.0, 100.0
MIN_WINDOW_S, MAX_WINDOW_S, DEFAULT_WINDOW_S = 10.0, 3600.0, 60.0
DEFAULT_MIN_COUNT, MAX_MIN_COUNT = 5, 1_000_000_000
DEFAULT_CAPTURE_STEPS = 5
DEFAULT_RECORDER_SECONDS = 60.0
MAX_COOLDOWN_S, DEFAULT_COOLDOWN_S = 86_400.0, 300.0
MAX_BUDGET, DEFAULT_BUDGET = 3600, 4
MAX_NAME = 100
RULE_KEYS = ("name", "metric", "threshold_ms", "percentile", "window_s", "min_count", "action", "cooldown_s",
             "budget_per_hour")
ACTION_KEYS = ("capture_steps", "recorder_seconds", "sync_scan")


@dataclass(frozen=True)
class TriggerAction:
    capture_steps: int = DEFAULT_CAPTURE_STEPS  # 0: no capture
    recorder_seconds: float = DEFAULT_RECORDER_SECONDS  # 0: no recorder dump
    sync_scan: bool = False  # a sync scan of as many steps (after the capture, when both)


@dataclass(frozen=True)
class TriggerRule:
    name: str
    metric: str
    threshold_ms: float
    percentile: float | None = None  # None: a single event
    window_s: float | None = None
    min_count: int | None = None
    action: TriggerAction = TriggerAction()
    cooldown_s: float = DEFAULT_COOLDOWN_S
    budget_per_hour: int = DEFAULT_BUDGET

    @property
    def single_event(self) -> bool:
        return self.percentile is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def number_field(body: dict, name: str, lo: float, hi: float, prefix: str, *, integer: bool = False,
            low_open: bool = False) -> float:
    value = body[name]
    # JSON's true is a Python int: not a number here. NaN and Infinity parse too (json.loads).
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ParamError(prefix + name, f"must be a {'whole ' if integer else ''}number, got {json.dumps(value)}")
    if integer and value != int(value):
        raise ParamError(prefix + name, f"must be a whole number, got {value!r}")
    if (value <= lo if low_open else value < lo) or value > hi:
        interval = f"{'(' if low_open else '['}{lo:g}, {hi:g}]"
        raise ParamError(prefix + name, f"must be in {interval}, got {value!r}")
    return int(value) if integer else float(value)


def reject_unknown_fields(body: dict, known: tuple[str, ...], prefix: str) -> None:
    unknown = [k for k in body if k not in known]
    if unknown:
        raise ParamError(prefix + str(unknown[0]), f"unknown field; known: {', '.join(known)}")


def parse_action(raw: Any, max_steps: int, prefix: str = "action.") -> TriggerAction:
    if raw is None:
        return TriggerAction(capture_steps=min(DEFAULT_CAPTURE_STEPS, max_steps))
    if not isinstance(raw, dict):
        raise ParamError(prefix.rstrip("."), "must be a JSON object")
    reject_unknown_fields(raw, ACTION_KEYS, prefix)
    steps = number_field(raw, "capture_steps", 0, max_steps, prefix, integer=True) if "capture_steps" in raw \
        else min(DEFAULT_CAPTURE_STEPS, max_steps)
    seconds = number_field(raw, "recorder_seconds", 0, MAX_QUERY_SECONDS, prefix) if "recorder_seconds" in raw \
        else DEFAULT_RECORDER_SECONDS
    scan = raw.get("sync_scan", False)
    if not isinstance(scan, bool):
        raise ParamError(prefix + "sync_scan", f"must be true or false, got {json.dumps(scan)}")
    if scan and steps == 0:
        raise ParamError(prefix + "sync_scan", "scans as many steps as capture_steps: give capture_steps >= 1")
    if steps == 0 and seconds == 0:
        raise ParamError(prefix.rstrip("."), "does nothing: give capture_steps >= 1 or recorder_seconds > 0")
    return TriggerAction(capture_steps=steps, recorder_seconds=seconds, sync_scan=scan)


def parse_rule(body: Any, max_steps: int, prefix: str = "") -> TriggerRule:
    """One rule from its JSON object. ``prefix`` goes before every field name an error names."""
    if not isinstance(body, dict):
        raise ParamError(prefix.rstrip(".") or "body", "must be a JSON object (a trigger rule)")
    reject_unknown_fields(body, RULE_KEYS, prefix)
    metric = body.get("metric")
    if metric is None:
        raise ParamError(prefix + "metric", f"is required: one of {', '.join(METRICS)}")
    if metric not in METRICS:
        raise ParamError(prefix + "metric", f"unknown metric {json.dumps(metric)}; use one of {', '.join(METRICS)}")
    if "threshold_ms" not in body:
        raise ParamError(prefix + "threshold_ms", "is required")
    threshold = number_field(body, "threshold_ms", 0, MAX_THRESHOLD_MS, prefix, low_open=True)
    percentile = window = min_count = None
    if "percentile" in body:
        percentile = number_field(body, "percentile", MIN_PERCENTILE, MAX_PERCENTILE, prefix)
        window = number_field(body, "window_s", MIN_WINDOW_S, MAX_WINDOW_S, prefix) if "window_s" in body \
            else DEFAULT_WINDOW_S
        min_count = number_field(body, "min_count", 1, MAX_MIN_COUNT, prefix, integer=True) if "min_count" in body \
            else DEFAULT_MIN_COUNT
    else:
        for name in ("window_s", "min_count"):
            if name in body:
                raise ParamError(prefix + name, "needs percentile (without one a rule is on a single event)")
        if metric not in SINGLE_EVENT_METRICS:
            raise ParamError(prefix + "percentile", f"is required for {metric} (only "
                             f"{', '.join(SINGLE_EVENT_METRICS)} has a rule on a single event)")
    name = body.get("name")
    if name is None:
        name = f"{metric} {'p%g' % percentile if percentile is not None else 'step'} > {threshold:g} ms"
    elif not isinstance(name, str) or not name.strip() or len(name) > MAX_NAME or not name.isprintable():
        raise ParamError(prefix + "name", f"must be printable text of 1 to {MAX_NAME} characters")
    return TriggerRule(
        name=name.strip(), metric=metric, threshold_ms=threshold, percentile=percentile, window_s=window,
        min_count=min_count, action=parse_action(body.get("action"), max_steps, prefix + "action."),
        **parse_limits(body, prefix),
    )


def parse_limits(body: dict, prefix: str) -> dict[str, Any]:
    """``cooldown_s`` and ``budget_per_hour`` of a trigger rule or an alert action, defaults filled in."""
    return {
        "cooldown_s": number_field(body, "cooldown_s", 1, MAX_COOLDOWN_S, prefix) if "cooldown_s" in body
        else DEFAULT_COOLDOWN_S,
        "budget_per_hour": number_field(body, "budget_per_hour", 1, MAX_BUDGET, prefix, integer=True)
        if "budget_per_hour" in body else DEFAULT_BUDGET,
    }


def parse_rules_file(text: str, max_steps: int) -> list[TriggerRule]:
    """``sidecar serve --triggers FILE``: a JSON list of rules; an error names ``rules[i].field``."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParamError("rules", f"invalid JSON: {exc}") from None
    if not isinstance(body, list):
        raise ParamError("rules", "must be a JSON list of trigger rules")
    return [parse_rule(item, max_steps, f"rules[{i}].") for i, item in enumerate(body)]
