"""Triggers: a slow server captures itself (docs/api.md, "Triggers").

``Triggers`` holds the rules (trigger_rules.py) and evaluates them on what already reaches the sidecar,
on its event loop, the moment it arrives: each heartbeat (a single-event step rule: the slowest step
that ended since the last beat, or the step still running, so a hung engine fires too) and each
metrics push (a percentile rule, histogram_window.py). No timer and no polling: the time from the
breaching report to the capture being armed is the sidecar's own processing, measured and recorded
as ``arm_latency_ms`` on each firing.

A breach that the limits refuse (trigger_limits.py) is recorded ``skipped`` with the reason (repeats
of one reason in a row are one record with a count, so that a long breach does not push the real
firings out of the list). A firing runs its action as every firing does (firing.py, shared with the
alerts): the capture first (armed when ``CaptureManager.start`` returns; another job running:
``capture_skipped: busy``), then the flight recorder's last seconds saved to
``<trace dir>/triggers/<firing id>.recorder.json.gz`` (the newest ``firing.KEEP_DUMPS`` kept), then the sync
scan once the capture has ended. Each firing, fired or skipped, counts in
``sidecar_trigger_firings_total{trigger, outcome}`` and is a ``trigger_firing`` span; a deleted
trigger's series leave /metrics with it.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter

from ..jobs.captures import Capture, CaptureManager
from .firing import FIRING_FIELDS, FiringContext, run_firing
from .histogram_window import HistogramWindows
from ..jobs.params import ParamError
from ..channel.queries import QueryBroker
from ..channel.registry import ProbeConnection, ProbeRegistry
from ..jobs.scans import ScanManager
from .trigger_limits import FiringLimits
from .trigger_rules import MAX_WINDOW_S, METRICS, TriggerRule

KEEP_FIRINGS = 20  # per trigger, in GET /triggers/{id}
MAX_TRIGGERS = 100
SPAN_NAME = "trigger_firing"
OUTCOMES = ("fired", "skipped")  # the outcome label of sidecar_trigger_firings_total


@dataclass(eq=False)
class Trigger:
    id: str
    rule: TriggerRule
    limits: FiringLimits
    created_at: float = field(default_factory=time.time)
    firings: deque = field(default_factory=lambda: deque(maxlen=KEEP_FIRINGS))  # of firing dicts, oldest first
    counts: dict[str, int] = field(default_factory=lambda: {"fired": 0, "skipped": 0})
    last_event: dict[int, int] = field(default_factory=dict)  # connection id -> last step that breached

    def to_json(self, *, with_firings: bool = False) -> dict[str, Any]:
        body = {"id": self.id, "rule": self.rule.to_json(), "created_at": self.created_at, "counts": dict(self.counts),
                "fired_last_hour": self.limits.used(time.monotonic())}
        if with_firings:
            body["firings"] = list(reversed(self.firings))  # newest first
        return body


class Triggers:
    def __init__(self, *, registry: ProbeRegistry, captures: CaptureManager, scans: ScanManager,
                 queries: QueryBroker, trace_dir: Path, metrics: CollectorRegistry,
                 on_dump: Callable[[Path], None] | None = None) -> None:
        self._captures, self._scans, self._queries = captures, scans, queries
        self._on_dump = on_dump  # each recorder dump saved (the object store's upload, sidecar serve --store)
        self._registry = registry
        self._dir = trace_dir / "triggers"
        self._triggers: dict[str, Trigger] = {}
        self._windows = HistogramWindows(METRICS.values(), MAX_WINDOW_S)
        self._tasks: set[asyncio.Task] = set()
        self._firings = Counter("sidecar_trigger_firings", "Trigger firings, by trigger and outcome (fired, skipped).",
                                ["trigger", "outcome"], registry=metrics)
        self._tracer = trace.get_tracer("inference-sidecar")
        registry.on_heartbeat(self.observe_heartbeat)
        from .step_alarm import step_alarm_teller  # the probes' step alarm (issue 30): kept in its own module

        # Each probe reports a step over the lowest single-event threshold as soon as it ends: told on every change.
        self._tell_step_alarm = step_alarm_teller(registry, self._triggers)
        self._tell_step_alarm()

    # -- the rules ---------------------------------------------------------------------------------
    def add(self, rule: TriggerRule) -> Trigger:
        if len(self._triggers) >= MAX_TRIGGERS:
            raise ParamError("body", f"at most {MAX_TRIGGERS} triggers; delete one first")
        trigger = Trigger(id="trg-" + secrets.token_hex(4), rule=rule,
                          limits=FiringLimits(rule.cooldown_s, rule.budget_per_hour))
        self._triggers[trigger.id] = trigger
        for outcome in OUTCOMES:  # from 0, so that rate() has a start
            self._firings.labels(trigger=trigger.id, outcome=outcome)
        self._tell_step_alarm()
        return trigger

    def get(self, trigger_id: str) -> Trigger | None:
        return self._triggers.get(trigger_id)

    def all(self) -> list[Trigger]:
        return list(self._triggers.values())

    def delete(self, trigger_id: str) -> Trigger | None:
        """Forget a trigger, and its series on /metrics: a trigger id is a label value, so series kept
        for deleted triggers would grow the registry (and every scrape) with each add and delete."""
        trigger = self._triggers.pop(trigger_id, None)
        if trigger is not None:
            for outcome in OUTCOMES:
                self._firings.remove(trigger.id, outcome)
            self._tell_step_alarm()
        return trigger

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- what reaches the sidecar ------------------------------------------------------------------
    def observe_heartbeat(self, conn: ProbeConnection, arrived: float) -> None:
        """A heartbeat was taken (``arrived``: monotonic): the single-event step rules."""
        candidates = []
        if conn.slowest_step_ms is not None and conn.slowest_step is not None:
            candidates.append((conn.slowest_step_ms, conn.slowest_step, "ended"))
        if conn.open_step_ms is not None:
            candidates.append((conn.open_step_ms, conn.steps + 1, "running"))
        if not candidates:
            return
        for trigger in self.all():
            rule = trigger.rule
            if not rule.single_event:
                continue
            for value, step, how in candidates:
                # One step breaches once per process: while it runs, and again when it ends, it is one event.
                if value > rule.threshold_ms and trigger.last_event.get(conn.id) != step:
                    trigger.last_event[conn.id] = step
                    self._breach(trigger, value, arrived, {"process": conn.identity.label, "step": step, "step_was": how})
                    break

    def observe_push(self, message, arrived: float) -> None:
        """A metrics push was taken (``arrived``: monotonic): the percentile rules."""
        now = time.time()
        if not self._windows.add(message, now):
            return
        for trigger in self.all():
            rule = trigger.rule
            if rule.single_event:
                continue
            got = self._windows.percentile(METRICS[rule.metric], rule.percentile, rule.window_s, now)
            if got.value_ms is not None and got.count >= rule.min_count and got.value_ms > rule.threshold_ms:
                self._breach(trigger, got.value_ms, arrived, {"events_in_window": got.count})

    # -- firing ------------------------------------------------------------------------------------
    def _breach(self, trigger: Trigger, value_ms: float, arrived: float, detail: dict[str, Any]) -> None:
        rule = trigger.rule
        now = time.monotonic()
        refusal = trigger.limits.refusal(now)
        if refusal is not None:
            self._skip(trigger, refusal, value_ms, detail)
            return
        trigger.limits.record(now)
        firing = {
            "id": f"{trigger.id}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(2)}",
            "at": time.time(), "outcome": "fired", "reason": None, "trigger": trigger.id, "name": rule.name,
            "metric": rule.metric, "percentile": rule.percentile, "observed_ms": round(value_ms, 3),
            "threshold_ms": rule.threshold_ms, **detail, **dict.fromkeys(FIRING_FIELDS),
        }
        trigger.firings.append(firing)
        trigger.counts["fired"] += 1
        self._firings.labels(trigger=trigger.id, outcome="fired").inc()
        trigger_json = {k: firing[k] for k in ("trigger", "name", "metric", "percentile", "observed_ms",
                                              "threshold_ms", "at")}
        trigger_json["firing"] = firing["id"]

        def started_by(capture: Capture) -> None:  # in capture.json at its next save, and GET /profile/{id} now
            capture.trigger = trigger_json

        task = asyncio.get_running_loop().create_task(run_firing(
            self._firing_context, firing, rule.action, arrived, started_by=started_by,
            finished=lambda f: self._span(trigger, f)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @functools.cached_property
    def _firing_context(self) -> FiringContext:
        return FiringContext(registry=self._registry, captures=self._captures, scans=self._scans,
                             queries=self._queries, dump_dir=self._dir, on_dump=self._on_dump)

    def _skip(self, trigger: Trigger, reason: str, value_ms: float, detail: dict[str, Any]) -> None:
        trigger.counts["skipped"] += 1
        self._firings.labels(trigger=trigger.id, outcome="skipped").inc()
        last = trigger.firings[-1] if trigger.firings else None
        if last is not None and last["outcome"] == "skipped" and last["reason"] == reason:
            last["times"] += 1
            last["last_at"] = time.time()
            last["observed_ms"] = max(last["observed_ms"], round(value_ms, 3))
            return
        trigger.firings.append({"at": time.time(), "last_at": time.time(), "times": 1, "outcome": "skipped",
                                "reason": reason, "trigger": trigger.id, "name": trigger.rule.name,
                                "metric": trigger.rule.metric, "observed_ms": round(value_ms, 3),
                                "threshold_ms": trigger.rule.threshold_ms, **detail})
        self._span(trigger, trigger.firings[-1])

    def _span(self, trigger: Trigger, firing: dict[str, Any]) -> None:
        attributes = {"sidecar.trigger.id": trigger.id, "sidecar.trigger.name": trigger.rule.name,
                      "sidecar.trigger.metric": trigger.rule.metric, "sidecar.trigger.outcome": firing["outcome"],
                      "sidecar.trigger.observed_ms": float(firing["observed_ms"]),
                      "sidecar.trigger.threshold_ms": float(trigger.rule.threshold_ms)}
        for key in ("reason", "capture", "recorder", "scan"):
            if firing.get(key):
                attributes[f"sidecar.trigger.{key}"] = str(firing[key])
        if firing.get("arm_latency_ms") is not None:
            attributes["sidecar.trigger.arm_latency_ms"] = float(firing["arm_latency_ms"])
        span = self._tracer.start_span(SPAN_NAME, start_time=int(firing["at"] * 1e9), attributes=attributes)
        span.end()

