"""Alertmanager's webhook body (version 4) as the sidecar reads it (docs/api.md, ``POST /alerts``).

``parse_payload`` checks every field the sidecar uses, in every alert, before anything is acted on: a
wrong one is a ``ParamError`` naming it in the body's own terms (``version``, ``alerts``,
``alerts[3].labels.instance``, ``alerts[0].startsAt``), so a bad notification fires nothing. Fields the
sidecar does not use (``groupKey``, ``annotations``, ``generatorURL``, ...) are not checked: a later
Alertmanager may add or change them.

A body holds at most ``MAX_ALERTS`` alerts (Alertmanager's ``max_alerts`` bounds what it sends); the
route bounds its bytes. An alert without ``fingerprint`` (a hand-written body) gets one made from its
labels, as Alertmanager makes its own: the same labels, the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ...common.protocol import MAX_ALERT_LABELS
from ..jobs.params import ParamError
from .alert_actions import label_problem

VERSION = "4"
MAX_ALERTS = 5000
MAX_LABELS = MAX_ALERT_LABELS  # each goes in the verdict (StartedBy.labels) of the capture it starts
MAX_FINGERPRINT = 64
STATUSES = ("firing", "resolved")


@dataclass(frozen=True)
class Alert:
    status: str  # firing or resolved
    labels: dict[str, str] = field(hash=False)
    starts_at: str  # as Alertmanager wrote it (RFC 3339)
    starts_at_s: float  # the same, in seconds since the epoch
    fingerprint: str

    @property
    def name(self) -> str:
        return self.labels.get("alertname", "")

    def to_json(self) -> dict[str, Any]:
        """How a capture, a firing and GET /alerts name the alert."""
        return {"name": self.name, "labels": dict(self.labels), "fingerprint": self.fingerprint,
                "starts_at": self.starts_at}


def parse_payload(body: Any) -> list[Alert]:
    if not isinstance(body, dict):
        raise ParamError("body", "must be a JSON object: Alertmanager's webhook notification (version 4)")
    if body.get("version") != VERSION:
        got = json.dumps(body.get("version"))[:40]
        raise ParamError("version", f"must be {json.dumps(VERSION)} (Alertmanager's webhook payload version 4), got {got}")
    alerts = body.get("alerts")
    if not isinstance(alerts, list):
        raise ParamError("alerts", "must be a JSON list of alerts")
    if len(alerts) > MAX_ALERTS:
        raise ParamError("alerts", f"at most {MAX_ALERTS} alerts in one notification, got {len(alerts)} "
                                   "(set max_alerts in the webhook_config)")
    return [_alert(raw, f"alerts[{i}]") for i, raw in enumerate(alerts)]


def _alert(raw: Any, where: str) -> Alert:
    if not isinstance(raw, dict):
        raise ParamError(where, "must be a JSON object (an alert)")
    status = raw.get("status")
    if status not in STATUSES:
        raise ParamError(f"{where}.status", f"must be firing or resolved, got {json.dumps(status)[:40]}")
    labels = raw.get("labels")
    if not isinstance(labels, dict):
        raise ParamError(f"{where}.labels", "must be a JSON object of labels")
    if len(labels) > MAX_LABELS:
        raise ParamError(f"{where}.labels", f"at most {MAX_LABELS} labels, got {len(labels)}")
    for name, value in labels.items():
        problem = label_problem(name, value)
        if problem:
            raise ParamError(f"{where}.labels.{name}", problem)
    starts_at = raw.get("startsAt")
    if not isinstance(starts_at, str):
        raise ParamError(f"{where}.startsAt", f"must be an RFC 3339 time as a string, got {json.dumps(starts_at)[:40]}")
    fingerprint = raw.get("fingerprint")
    if fingerprint is None:
        fingerprint = _fingerprint(labels)
    elif (not isinstance(fingerprint, str) or not 0 < len(fingerprint) <= MAX_FINGERPRINT
          or not fingerprint.isascii() or not fingerprint.isalnum()):
        raise ParamError(f"{where}.fingerprint", f"must be 1 to {MAX_FINGERPRINT} letters and digits, "
                                                 f"got {json.dumps(fingerprint)[:40]}")
    return Alert(status=status, labels=labels, starts_at=starts_at, starts_at_s=_seconds(starts_at, where),
                 fingerprint=fingerprint)


def _seconds(text: str, where: str) -> float:
    try:
        if len(text) > 64:
            raise ValueError("too long")
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ParamError(f"{where}.startsAt", f"must be an RFC 3339 time, got {json.dumps(text)[:60]}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _fingerprint(labels: dict[str, str]) -> str:
    text = json.dumps(sorted(labels.items()), separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
