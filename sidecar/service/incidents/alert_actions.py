"""What the sidecar does with Alertmanager's alerts (docs/api.md, "Alerts"): ``sidecar serve
--alert-actions FILE``, a JSON list of actions, each the labels an alert must have and a trigger's
action, cooldown and budget; and ``OwnServer``, which alerts are about this sidecar's server.

An action file is parsed once, at start: every bad value is a ``ParamError`` naming ``[i].field``
(``[2].match.severity``, ``[0].action.capture_steps``), so nothing half-valid is acted on. An alert
matches an action when each label the action lists has that value in the alert (``""`` stands for a
label the alert does not have, as in Prometheus); the first matching action is the alert's.

Which alerts are this server's: an alert about a server names it with its ``pod`` label (Kubernetes)
or its ``instance`` label (the address Prometheus scrapes, ``host:port``). ``pod`` decides when the
alert has it: equal to ``$POD_NAME``, else this host's name (a Kubernetes pod's host name is the pod's
name). Else ``instance``: one of the ``--alert-instance`` values when given; without them, a name or
address of this host (its host name, ``$POD_IP``, the addresses its name resolves to, loopback, the
address the notification reached) with the port the notification reached. An alert with neither
label is this server's: nothing says otherwise.
"""

from __future__ import annotations

import functools
import json
import os
import socket
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from ..jobs.params import ParamError
from .trigger_rules import (DEFAULT_BUDGET, DEFAULT_COOLDOWN_S, TriggerAction, parse_action, parse_limits,
                            reject_unknown_fields)

MAX_ACTIONS = 100
MAX_MATCH_LABELS = 32
MAX_LABEL_NAME = 128
MAX_LABEL_VALUE = 1024
MAX_INSTANCE = 256
ACTION_KEYS = ("match", "action", "cooldown_s", "budget_per_hour")
ENV_POD_NAME = "POD_NAME"
ENV_POD_IP = "POD_IP"


@dataclass(frozen=True)
class AlertAction:
    match: tuple[tuple[str, str], ...]  # (label, value), in the file's order
    action: TriggerAction
    cooldown_s: float = DEFAULT_COOLDOWN_S
    budget_per_hour: int = DEFAULT_BUDGET

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(name, "") == value for name, value in self.match)

    def to_json(self) -> dict[str, Any]:
        return {"match": dict(self.match), "action": asdict(self.action), "cooldown_s": self.cooldown_s,
                "budget_per_hour": self.budget_per_hour}


def label_problem(name: Any, value: Any) -> str | None:
    """What is wrong with one label (a name and its value as JSON gave them), or None."""
    if not isinstance(name, str) or not name or len(name) > MAX_LABEL_NAME or not name.isprintable():
        return f"a label name must be printable text of 1 to {MAX_LABEL_NAME} characters"
    if not isinstance(value, str):
        return f"must be a string, got {json.dumps(value)[:40]}"
    if len(value) > MAX_LABEL_VALUE:
        return f"must be at most {MAX_LABEL_VALUE} characters, got {len(value)}"
    return None


def _match(raw: Any, prefix: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, dict):
        raise ParamError(prefix + "match", 'must be a JSON object of labels, e.g. {"alertname": "InferenceTimeToFirstTokenHigh"}')
    if len(raw) > MAX_MATCH_LABELS:
        raise ParamError(prefix + "match", f"at most {MAX_MATCH_LABELS} labels, got {len(raw)}")
    for name, value in raw.items():
        problem = label_problem(name, value)
        if problem:
            raise ParamError(f"{prefix}match.{name}", problem)
    return tuple(raw.items())


def parse_alert_action(body: Any, max_steps: int, prefix: str = "") -> AlertAction:
    """One action from its JSON object; ``prefix`` goes before every field an error names."""
    if not isinstance(body, dict):
        raise ParamError(prefix.rstrip(".") or "body", "must be a JSON object (an alert action)")
    reject_unknown_fields(body, ACTION_KEYS, prefix)
    if "match" not in body:
        raise ParamError(prefix + "match", "is required: the labels an alert must have ({} for every alert)")
    return AlertAction(
        match=_match(body["match"], prefix),
        action=parse_action(body.get("action"), max_steps, prefix + "action."),
        **parse_limits(body, prefix),
    )


def parse_alert_actions_file(text: str, max_steps: int) -> list[AlertAction]:
    """``sidecar serve --alert-actions FILE``: a JSON list of actions; an error names ``[i].field``."""
    try:
        body = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParamError("actions", f"invalid JSON: {exc}") from None
    if not isinstance(body, list):
        raise ParamError("actions", "must be a JSON list of alert actions")
    if len(body) > MAX_ACTIONS:
        raise ParamError("actions", f"at most {MAX_ACTIONS} actions, got {len(body)}")
    return [parse_alert_action(item, max_steps, f"[{i}].") for i, item in enumerate(body)]


def instance_problem(value: str) -> str | None:
    """What is wrong with an ``--alert-instance`` value, or None."""
    if not value or len(value) > MAX_INSTANCE or not value.isprintable() or any(c.isspace() for c in value):
        return f"must be an instance label's value (host:port), 1 to {MAX_INSTANCE} characters without spaces"
    return None


def split_instance(value: str) -> tuple[str, str | None]:
    """An ``instance`` label as (lower-case host, port or None): ``host:port``, ``[v6]:port``, ``host``."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        return host, rest[1:] if rest.startswith(":") and rest[1:] else None
    if value.count(":") == 1:
        host, _, port = value.partition(":")
        return host.rstrip("."), port or None
    return value.rstrip("."), None  # a name without a port, or a bare IPv6 address


@functools.lru_cache(maxsize=1)
def _this_host() -> frozenset[str]:
    """This host's names and addresses, lower-case (resolved once per process: a name lookup may take a while)."""
    names = {"localhost", "127.0.0.1", "::1"}
    hostname = socket.gethostname().lower()
    names.add(hostname)
    try:
        names.update(str(info[4][0]).lower() for info in socket.getaddrinfo(hostname, None))
    except OSError:
        pass
    return frozenset(names)


@dataclass(frozen=True)
class OwnServer:
    """Which alerts are about this sidecar's server (the module's docstring says how it decides)."""

    pod: str
    instances: tuple[str, ...] = ()  # --alert-instance; none: this host's names and addresses
    hosts: frozenset[str] = frozenset()

    @classmethod
    def of_this_host(cls, instances: Sequence[str] = (), env: Mapping[str, str] | None = None) -> "OwnServer":
        env = os.environ if env is None else env
        pod = env.get(ENV_POD_NAME, "").strip() or socket.gethostname()
        pod_ip = env.get(ENV_POD_IP, "").strip().lower()
        return cls(pod=pod, instances=tuple(instances), hosts=_this_host() | ({pod_ip} if pod_ip else set()))

    def other_server(self, labels: Mapping[str, str], reached: tuple[str, int] | None) -> str | None:
        """Why an alert with these labels is about another server (None: it is about this one).
        ``reached``: the address and port the notification reached this sidecar at."""
        pod = labels.get("pod")
        if pod:
            if pod == self.pod:
                return None
            return f"pod {pod!r} is another server: this sidecar's pod is {self.pod!r} (${ENV_POD_NAME}, else the host name)"
        instance = labels.get("instance")
        if not instance:
            return None
        if self.instances:
            if instance in self.instances:
                return None
            return f"instance {instance!r} is another server: this sidecar is {', '.join(self.instances)} (--alert-instance)"
        host, port = split_instance(instance)
        own_port = str(reached[1]) if reached else None
        own_hosts = self.hosts | ({str(reached[0]).lower()} if reached else set())
        if host in own_hosts and (port is None or port == own_port):
            return None
        where = f"{reached[0]}:{reached[1]}" if reached else "unknown"
        return (f"instance {instance!r} is another server: this sidecar was reached at {where} on host "
                f"{socket.gethostname()!r} (give --alert-instance the address Prometheus scrapes it at)")

    def to_json(self) -> dict[str, Any]:
        return {"pod": self.pod, "instances": list(self.instances)}
