"""The step alarm's threshold (issue 30): the lowest ``threshold_ms`` of the single-event step rules.

The triggers (triggers.py) give it to the registry (sidecar/service/channel/registry.py,
``set_step_alarm``) whenever their rules change; the registry sends it to every probe, whose link
thread then reports a step over it as soon as the step ends (sidecar/probe/heartbeat.py): a
single-event rule fires within a second of the slow step's end instead of at the next 2 s heartbeat.
The lowest is enough: a probe sends a whole heartbeat, which every rule is evaluated on as usual.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable


def lowest_step_threshold(triggers: Iterable[Any]) -> float | None:
    """The lowest threshold (ms) of the triggers' single-event rules; None when there is none.
    ``triggers``: objects with a ``rule`` (triggers.Trigger)."""
    return min((t.rule.threshold_ms for t in triggers if t.rule.single_event), default=None)


def step_alarm_teller(registry: Any, triggers: dict[str, Any]) -> Callable[[], None]:
    """What ``Triggers`` calls after its rules change (and once at its start): the registry is told
    the lowest threshold of ``triggers`` (its live dict of ``Trigger``, by id) as they are then."""

    def tell() -> None:
        registry.set_step_alarm(lowest_step_threshold(triggers.values()))

    return tell
