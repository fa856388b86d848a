"""The common start step of a job: the one place where ``delay`` applies, for captures and scans.

Arming has two phases. The sidecar sends ``arm`` / ``sync_arm``; every step-driven probe answers
with its count of working steps (``steps_seen``). Every process of an engine counts the same working
steps, so one ``begin`` with a start step ahead of all the counts makes every process record the
*same* engine steps — per engine instance (``ProcessIdentity.instance``): two instances count their own
steps, and each gets a start step ahead of its own counts. The lead covers the time ``begin`` takes to reach the probes: 2 steps plus
``BEGIN_LEAD_S`` at the fastest observed step rate, or the slowest probe's round trip for ``arm``
where that was longer (a loaded host, a busy event loop: ``begin`` travels the same way). ``delay`` (working steps to skip) is added here
and nowhere else: the probes are told only where to start. A count is projected to the moment
``begin`` leaves: a process that answered at once has stepped on while the sidecar waited for a
slower one (up to ``ARM_REPLY_S``).

A capture bound to a request (captures.py) has no lead and no delay: the request waits for every
"armed" and then runs at once, so its first step may be any step after the counts the probes
answered with, and each probe began from its own count when it was armed (sidecar/protocol.py).
``at_once`` is the highest of those counts: it still covers the request's first step, and every
process that has not begun yet when it arrives starts at the same step as the others.

A rate is only ever measured between two counts this sidecar received on one connection
(registry.py): right after a (re)connect there may be none. Then the lead is the minimum, on purpose:
a lead too short makes a process start a step or two late (the capture's notes name it), while one
guessed too long makes the job wait for steps that may never come (a burst that ends, its timeout).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

ARM_REPLY_S = 3.0  # how long every step-driven probe has to answer "arm" before it counts as lost
BEGIN_LEAD_S = 0.25  # the start step lies this far ahead at the fastest observed step rate
MIN_LEAD_STEPS = 2  # also the whole lead while no rate is measured


def fastest_rate(rates: Iterable[float | None]) -> float | None:
    """The fastest of the measured rates (None: not measured yet); None when none is measured."""
    return max((r for r in rates if r is not None), default=None)


def lead_seconds(arm_round_trip_s: float | None) -> float:
    """How far ahead the start step lies in time: ``BEGIN_LEAD_S``, or the slowest ``arm`` round
    trip where that was longer, at most ``ARM_REPLY_S`` (a reply later than that is lost anyway)."""
    return min(max(BEGIN_LEAD_S, arm_round_trip_s or 0.0), ARM_REPLY_S)


def lead_steps(fastest_rate: float | None, arm_round_trip_s: float | None = None) -> int:
    if fastest_rate is None:
        return MIN_LEAD_STEPS
    return MIN_LEAD_STEPS + math.ceil(max(fastest_rate, 0.0) * lead_seconds(arm_round_trip_s))


def projected(steps_seen: int, fastest_rate: float | None, waited_s: float) -> int:
    """A process's count when ``begin`` leaves: its ``armed`` count plus the steps it may have taken
    while the sidecar waited for the others' replies, at the fastest rate (whole steps: the lead's
    2 steps cover the fraction)."""
    if not fastest_rate or waited_s <= 0:
        return steps_seen
    return steps_seen + int(fastest_rate * waited_s)


def start_step(steps_seen: Iterable[int], fastest_rate: float | None, delay: int,
               arm_round_trip_s: float | None = None) -> int:
    """``max(steps_seen) + lead + delay``; ``steps_seen`` must not be empty."""
    return max(steps_seen) + lead_steps(fastest_rate, arm_round_trip_s) + delay


def by_instance(processes: Sequence[Any]) -> dict[str, list[Any]]:
    """Step-driven processes grouped by engine instance (``identity.instance``, "" when unnamed), in
    their order. The processes of one instance count the same steps; two instances (two servers
    sharing a sidecar, data-parallel engine cores) count their own, so each gets its own start step."""
    groups: dict[str, list[Any]] = {}
    for rec in processes:
        groups.setdefault(rec.identity.instance, []).append(rec)
    return groups


def at_once(steps_seen: Iterable[int]) -> int:
    """The start step of a job that must record the next working step: ``max(steps_seen)`` (not empty)."""
    return max(steps_seen)
