"""Alertmanager as a trigger (docs/api.md, "Alerts"): ``POST /alerts`` hands ``Alerts.receive`` the
alerts of one webhook notification (alert_payload.py); each firing alert that an action of ``sidecar
serve --alert-actions FILE`` matches (alert_actions.py) runs the triggers' firing path (firing.py:
capture, recorder dump, scan) within that action's cooldown and hourly budget (trigger_limits.py).

Each alert is decided in one pass, without awaiting anything: a storm of thousands of alerts costs
the event loop O(alerts), and a firing's capture starts on a task of its own. The first that applies:

- ``resolved``: the alert has ended; nothing to do;
- ``other_server``: its ``pod`` or ``instance`` label names another server (``OwnServer``);
- ``duplicate``: this fingerprint came before with this ``startsAt``: Alertmanager sends a firing
  alert again at each change of its group and every ``repeat_interval``; one episode of an alert acts
  once (the fingerprints remembered are bounded, ``MAX_SEEN``, the oldest forgotten first);
- ``no_action``: no action matches its labels;
- ``cooldown``, ``budget``: its action's limits refuse it;
- else ``fired``: a firing record, and its capture names the alert (``capture.alert``: capture.json,
  GET /profile/{id}, the report, and the capture span through the verdict).

Everything is seen: ``GET /alerts`` lists the last firings and skips (repeats of one alert name and
reason in a row are one entry with a count, so that a storm does not push the firings out), each
alert counts in ``sidecar_alert_firings_total{alertname, outcome}`` (at most ``MAX_ALERTNAMES`` names;
the rest as ``OTHER_NAME``), and each firing and each new skip entry (duplicates excepted) is an
``alert_firing`` span. ``start_to_armed_ms`` on a firing: from the alert's ``startsAt`` (Prometheus's
clock) to its capture armed (the sidecar's).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any, Callable, Sequence

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter

from ..channel.queries import QueryBroker
from ..channel.registry import ProbeRegistry
from ..jobs.captures import Capture, CaptureManager
from ..jobs.scans import ScanManager
from .alert_actions import AlertAction, OwnServer
from .alert_payload import Alert
from .firing import FIRING_FIELDS, FiringContext, run_firing
from .trigger_limits import FiringLimits

KEEP_FIRINGS = 20  # fired alerts in GET /alerts
KEEP_SKIPPED = 50  # skip entries in GET /alerts
MAX_SEEN = 10_000  # fingerprints remembered for the duplicates
MAX_ALERTNAMES = 50  # distinct alertname values of sidecar_alert_firings_total
OTHER_NAME = "_other"
SPAN_NAME = "alert_firing"
OUTCOMES = ("fired", "skipped")  # the outcome label of sidecar_alert_firings_total
SKIP_REASONS = ("resolved", "other_server", "duplicate", "no_action", "cooldown", "budget")


class Alerts:
    def __init__(self, actions: Sequence[AlertAction], own: OwnServer, *, registry: ProbeRegistry,
                 captures: CaptureManager, scans: ScanManager, queries: QueryBroker, trace_dir: Path,
                 metrics: CollectorRegistry, on_dump: Callable[[Path], None] | None = None) -> None:
        self.actions = list(actions)
        self.own = own
        self._limits = [FiringLimits(a.cooldown_s, a.budget_per_hour) for a in self.actions]
        self._ctx = FiringContext(registry=registry, captures=captures, scans=scans, queries=queries,
                                  dump_dir=trace_dir / "alerts", on_dump=on_dump)
        self._firings: deque[dict[str, Any]] = deque(maxlen=KEEP_FIRINGS)
        self._skipped: deque[dict[str, Any]] = deque(maxlen=KEEP_SKIPPED)
        self._seen: OrderedDict[str, str] = OrderedDict()  # fingerprint -> startsAt
        self.counts = dict.fromkeys(("fired", *SKIP_REASONS), 0)
        self._tasks: set[asyncio.Task] = set()
        self._counter = Counter("sidecar_alert_firings", "Alertmanager alerts received, by alert name and outcome "
                                "(fired, skipped).", ["alertname", "outcome"], registry=metrics)
        self._names: set[str] = set()
        for action in self.actions:  # from 0, so that rate() has a start
            name = dict(action.match).get("alertname")
            if name:
                for outcome in OUTCOMES:
                    self._counter.labels(alertname=self._name_label(name), outcome=outcome)
        self._tracer = trace.get_tracer("inference-sidecar")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- one notification ------------------------------------------------------------------------------
    def receive(self, alerts: Sequence[Alert], reached: tuple[str, int] | None) -> dict[str, Any]:
        """Decide and act on each alert of one notification; the answer to ``POST /alerts``.
        ``reached``: the address and port the notification reached this sidecar at."""
        arrived = time.monotonic()
        answers = [self._one(alert, reached, arrived) for alert in alerts]
        fired = sum(1 for a in answers if a["outcome"] == "fired")
        return {"received": len(answers), "fired": fired, "skipped": len(answers) - fired, "alerts": answers}

    def _one(self, alert: Alert, reached: tuple[str, int] | None, arrived: float) -> dict[str, Any]:
        if alert.status == "resolved":
            return self._skip(alert, "resolved", None)
        other = self.own.other_server(alert.labels, reached)
        if other is not None:
            return self._skip(alert, "other_server", other)
        if self._seen.get(alert.fingerprint) == alert.starts_at:
            self._seen.move_to_end(alert.fingerprint)
            return self._skip(alert, "duplicate", "this alert (fingerprint and startsAt) came before")
        self._seen[alert.fingerprint] = alert.starts_at
        self._seen.move_to_end(alert.fingerprint)
        if len(self._seen) > MAX_SEEN:
            self._seen.popitem(last=False)
        index = next((i for i, action in enumerate(self.actions) if action.matches(alert.labels)), None)
        if index is None:
            return self._skip(alert, "no_action", f"none of the {len(self.actions)} alert actions matches its labels")
        now = time.monotonic()
        refusal = self._limits[index].refusal(now)
        if refusal is not None:
            return self._skip(alert, refusal, f"alert action [{index}]")
        self._limits[index].record(now)
        return self._fire(alert, index, arrived)

    def _fire(self, alert: Alert, index: int, arrived: float) -> dict[str, Any]:
        firing = {
            "id": f"alert-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{alert.fingerprint[:8]}-{secrets.token_hex(2)}",
            "at": time.time(), "outcome": "fired", "reason": None, "alert": alert.to_json(), "action": index,
            "start_to_armed_ms": None, **dict.fromkeys(FIRING_FIELDS),
        }
        self._firings.append(firing)
        self._count(alert, "fired")
        stamp = {**alert.to_json(), "firing": firing["id"]}

        def started_by(capture: Capture) -> None:  # in capture.json at its next save, and GET /profile/{id} now
            capture.alert = stamp
            firing["start_to_armed_ms"] = round((time.time() - alert.starts_at_s) * 1000, 3)

        task = asyncio.get_running_loop().create_task(run_firing(
            self._ctx, firing, self.actions[index].action, arrived, started_by=started_by, finished=self._span))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return _answer(alert, "fired", None, None, firing["id"])

    def _skip(self, alert: Alert, reason: str, detail: str | None) -> dict[str, Any]:
        self._count(alert, reason)
        last = self._skipped[-1] if self._skipped else None
        if last is not None and last["reason"] == reason and last["alert"]["name"] == alert.name:
            last["times"] += 1
            last["last_at"] = time.time()
        else:
            now = time.time()
            self._skipped.append({"at": now, "last_at": now, "times": 1, "outcome": "skipped", "reason": reason,
                                  "detail": detail, "alert": alert.to_json()})
            if reason != "duplicate":
                self._span(self._skipped[-1])
        return _answer(alert, "skipped", reason, detail, None)

    def _count(self, alert: Alert, reason: str) -> None:
        self.counts[reason] += 1
        outcome = "fired" if reason == "fired" else "skipped"
        self._counter.labels(alertname=self._name_label(alert.name), outcome=outcome).inc()

    def _name_label(self, name: str) -> str:
        """The alertname label value: the first ``MAX_ALERTNAMES`` names as they are, the rest as one."""
        if name not in self._names:
            if len(self._names) >= MAX_ALERTNAMES:
                return OTHER_NAME
            self._names.add(name)
        return name

    # -- what is seen ----------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """``GET /alerts``."""
        now = time.monotonic()
        return {
            "actions": [{**a.to_json(), "fired_last_hour": limits.used(now)} for a, limits in zip(self.actions, self._limits)],
            "own": self.own.to_json(),
            "counts": dict(self.counts),
            "firings": list(reversed(self._firings)),  # newest first
            "skipped": list(reversed(self._skipped)),
        }

    def _span(self, entry: dict[str, Any]) -> None:
        alert = entry["alert"]
        attributes = {"sidecar.alert.name": alert["name"], "sidecar.alert.fingerprint": alert["fingerprint"],
                      "sidecar.alert.starts_at": alert["starts_at"],
                      "sidecar.alert.labels": [f"{k}={v}" for k, v in sorted(alert["labels"].items())],
                      "sidecar.alert.outcome": entry["outcome"]}
        for key in ("reason", "capture", "recorder", "scan"):
            if entry.get(key):
                attributes[f"sidecar.alert.{key}"] = str(entry[key])
        for key in ("arm_latency_ms", "start_to_armed_ms"):
            if entry.get(key) is not None:
                attributes[f"sidecar.alert.{key}"] = float(entry[key])
        span = self._tracer.start_span(SPAN_NAME, start_time=int(entry["at"] * 1e9), attributes=attributes)
        span.end()


def _answer(alert: Alert, outcome: str, reason: str | None, detail: str | None, firing: str | None) -> dict[str, Any]:
    """One alert's line in the answer to ``POST /alerts``."""
    return {"name": alert.name, "fingerprint": alert.fingerprint, "outcome": outcome, "reason": reason,
            "detail": detail, "firing": firing}
