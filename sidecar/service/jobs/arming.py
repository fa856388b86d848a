"""The common start step of a job: the one place where ``delay`` applies, for captures and scans.

Arming has two phases. The sidecar sends ``arm`` / ``sync_arm``; every step-driven probe answers
with its count of working steps (``steps_seen``). Every process of an engine counts the same working
steps, so one ``begin`` with a start step ahead of all the counts makes every process record the
*same* engine steps — per engine instance (``ProcessIdentity.instance``): two instances count their own
steps, and each gets a start step ahead of its own counts. The lead covers the time ``begin`` takes
to reach the probes: 2 steps plus, at the fastest observed step rate, the longest of ``BEGIN_LEAD_S``,
twice the slowest probe's round trip for ``arm`` (a loaded host, a busy event loop: ``begin``
travels the same way, and one message's delivery varies), and half as much again as a ``begin`` once
took to reach one of these processes (``begin_took``: learned from a process that started late, kept
on its connection), so that a host whose probes were reached late gets a longer lead from then on,
fading over the jobs that start on time after it (``on_time``). ``delay`` (working steps to skip) is added here
and nowhere else: the probes are told only where to start. A count is projected to the moment
``begin`` leaves: a process that answered at once has stepped on while the sidecar waited for a
slower one (up to ``ARM_REPLY_S``).

A capture bound to a request (captures.py) has no lead and no delay: the request waits for every
"armed" and then runs at once, so its first step may be any step after the counts the probes
answered with, and each probe began from its own count when it was armed (sidecar/common/protocol.py).
``at_once`` is the highest of those counts: it still covers the request's first step, and every
process that has not begun yet when it arrives starts at the same step as the others.

The rates are those measured between two counts this sidecar received on one connection
(sidecar/service/channel/registry.py), and each process's own rate over its last 2 s, which it sends with "armed" (its flight
recorder's rows, StepRing.recent_rate): right after a (re)connect only the second exists. Where
neither does (the flight recorder off, or fewer than two steps in 2 s) the lead is the minimum, on
purpose: a lead too short makes a process start a step or two late (the capture's notes name it),
while one guessed too long makes the job wait for steps that may never come (a burst that ends, its
timeout).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

ARM_REPLY_S = 3.0  # how long every step-driven probe has to answer "arm" before it counts as lost
# ...unless it has sent a heartbeat since its arm left: alive, its link thread only slow to answer (a
# loaded host: two vLLM servers on 2 cores once kept a worker from answering for over 3 s, and the
# capture went partial). Such a process is waited for up to this long after the arm.
ARM_REPLY_ALIVE_S = 10.0
# The start step lies at least this far ahead at the fastest observed step rate. 0.25 s was short on
# a loaded 2-core host: a worker's begin arrived 4 steps late on real vLLM; a capture that starts a
# quarter of a second later costs its user nothing.
BEGIN_LEAD_S = 0.5
ROUND_TRIPS = 2.0  # the lead is at least this many of the slowest "arm" round trip
LEARNED_MARGIN = 1.5  # and this much of the longest a begin took to reach one of the processes
# What a begin that arrived on time leaves of that: a slow spell (a load peak) lengthens the leads
# that follow it, and fades over the captures that start on time after it.
ON_TIME_DECAY = 0.8
MIN_LEAD_STEPS = 2  # also the whole lead while no rate is measured


def fastest_rate(rates: Iterable[float | None]) -> float | None:
    """The fastest of the measured rates (None: not measured yet); None when none is measured."""
    return max((r for r in rates if r is not None), default=None)


def lead_seconds(arm_round_trip_s: float | None = None, begin_took_s: float = 0.0) -> float:
    """How far ahead the start step lies in time: the longest of ``BEGIN_LEAD_S``, ``ROUND_TRIPS``
    slowest ``arm`` round trips and ``LEARNED_MARGIN`` times the longest a begin took to reach one of
    the processes, at most ``ARM_REPLY_S`` (a reply later than that is lost anyway)."""
    return min(max(BEGIN_LEAD_S, ROUND_TRIPS * (arm_round_trip_s or 0.0), LEARNED_MARGIN * begin_took_s),
               ARM_REPLY_S)


def lead_steps(fastest_rate: float | None, lead_s: float = BEGIN_LEAD_S) -> int:
    """The lead in steps: ``MIN_LEAD_STEPS`` plus ``lead_s`` at ``fastest_rate`` (only the minimum
    while no rate is measured)."""
    if fastest_rate is None:
        return MIN_LEAD_STEPS
    return MIN_LEAD_STEPS + math.ceil(max(fastest_rate, 0.0) * lead_s)


def begin_took(lead_s: float, late_steps: int, rate: float | None) -> float | None:
    """At least how long a ``begin`` sent ``lead_s`` ahead took to reach a process that started
    ``late_steps`` working steps after its start step, at its step ``rate`` (None: no rate, no
    estimate)."""
    if late_steps <= 0 or not rate or rate <= 0:
        return None
    return lead_s + late_steps / rate


def learned(begin_took_s: float, lead_s: float, late_steps: int, rate: float | None) -> float:
    """What is kept of how long a begin takes to reach a process, after one sent ``lead_s`` ahead
    reached it ``late_steps`` working steps after its start step (0: on time), at its step ``rate``:
    raised to at least what a late one took, faded by one on time."""
    if late_steps <= 0:
        return on_time(begin_took_s)
    took = begin_took(lead_s, late_steps, rate)
    return begin_took_s if took is None else max(begin_took_s, took)


def on_time(begin_took_s: float) -> float:
    """What is kept of how long a begin took once another reached the process on time."""
    return begin_took_s * ON_TIME_DECAY


def projected(steps_seen: int, fastest_rate: float | None, waited_s: float) -> int:
    """A process's count when ``begin`` leaves: its ``armed`` count plus the steps it may have taken
    while the sidecar waited for the others' replies, at the fastest rate (whole steps: the lead's
    2 steps cover the fraction)."""
    if not fastest_rate or waited_s <= 0:
        return steps_seen
    return steps_seen + int(fastest_rate * waited_s)


def start_step(steps_seen: Iterable[int], fastest_rate: float | None, delay: int,
               lead_s: float = BEGIN_LEAD_S) -> int:
    """``max(steps_seen) + lead + delay``; ``steps_seen`` must not be empty."""
    return max(steps_seen) + lead_steps(fastest_rate, lead_s) + delay


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
