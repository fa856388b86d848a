"""``sidecar recorder`` on a terminal: the flight recorder's story in one screen instead of its JSON.

Ten seconds of a busy server are about a megabyte of ``GET /recorder`` rows (docs/api.md): right for a
file or ``jq``, useless scrolled past on a terminal. ``render`` reads that same answer and tells, per
engine process, the step-time percentiles and the slowest steps with their rows (batch, tokens,
prefill/decode, running/waiting, GC inside the step), the GC pauses worth a look, a step still
running; then the finished requests' time to first token and end-to-end percentiles and the requests
in flight. Nothing here asks the sidecar anything: the JSON, printed with ``--json`` or saved with
``-o``, holds every figure shown.

Percentiles are by nearest rank (a value that was seen), as the fleet comparison's p99.
"""

from __future__ import annotations

import math
import time
from typing import Any, Iterable

SLOWEST_SHOWN = 5
GC_PAUSE_SHOWN_MS = 5.0  # pauses from this long on are listed (a collection that short is rarely the story)
GC_PAUSES_LISTED = 5
PERCENTILES = (50, 90, 99)


def percentile(ordered: list[float], p: float) -> float:
    """The ``p``-th percentile of an ascending, non-empty list, by nearest rank."""
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def spread(values: Iterable[float]) -> str:
    """``p50 12.1  p90 15.3  p99 48.2  max 210.4`` (ms), or ``none`` for no values."""
    ordered = sorted(values)
    if not ordered:
        return "none"
    cells = [f"p{p} {_figure(percentile(ordered, p))}" for p in PERCENTILES] + [f"max {_figure(ordered[-1])}"]
    return "  ".join(cells)


def _figure(value: float | None) -> str:
    """A duration (ms or s) to one decimal from 10 on, else two."""
    if value is None:
        return "?"
    return f"{value:,.1f}" if value >= 10 else f"{value:.2f}"


def _clock(ns: int | None) -> str:
    """Wall time of a Unix-ns instant, UTC, to the millisecond."""
    if not ns:
        return "?"
    return time.strftime("%H:%M:%S", time.gmtime(ns / 1e9)) + f".{int(ns % 1_000_000_000) // 1_000_000:03d}"


def _counts(step: dict[str, Any]) -> str:
    """A step's row as a person reads it; counts the process does not know are left out."""
    parts = []
    if step.get("batch") is not None:
        parts.append(f"batch {step['batch']}")
    if step.get("tokens") is not None:
        split = [f"{name} {step[key]}" for name, key in (("prefill", "prefill_tokens"), ("decode", "decode_tokens"))
                 if step.get(key) is not None]
        parts.append(f"tokens {step['tokens']}" + (f" ({', '.join(split)})" if split else ""))
    queue = [f"{key} {step[key]}" for key in ("running", "waiting") if step.get(key) is not None]
    parts.extend(queue)
    if step.get("gc_ms"):
        parts.append(f"GC {_figure(step['gc_ms'])} ms")
    return ", ".join(parts)


def _process_lines(proc: dict[str, Any]) -> list[str]:
    label = (proc.get("process") or {}).get("label") or "?"
    if proc.get("error"):
        return [f"{label}: nothing came back ({proc['error']})"]
    steps = proc.get("steps") or []
    working = [s for s in steps if s.get("working") and s.get("duration_ms") is not None]
    lines = []
    if steps or proc.get("capacity"):
        lines.append(f"{label}: {len(working):,} working steps of {len(steps):,}")
        lines.append(f"  step ms   {spread(s['duration_ms'] for s in working)}")
        slowest = sorted(working, key=lambda s: -s["duration_ms"])[:SLOWEST_SHOWN]
        if slowest:
            lines.append("  slowest steps")
            for s in slowest:
                row = _counts(s)
                lines.append(f"    step {s.get('step')}  {_figure(s['duration_ms'])} ms  at {_clock(s.get('start_ns'))}"
                             + (f"  {row}" if row else ""))
    else:
        lines.append(f"{label}: takes no steps of its own (its requests are below)")
    pauses = [g for g in proc.get("gc") or [] if (g.get("duration_ms") or 0) >= GC_PAUSE_SHOWN_MS]
    if pauses:
        total = sum(g["duration_ms"] for g in pauses)
        lines.append(f"  GC pauses of {GC_PAUSE_SHOWN_MS:g} ms or more: {len(pauses)}, {_figure(total)} ms in all")
        for g in sorted(pauses, key=lambda g: -g["duration_ms"])[:GC_PAUSES_LISTED]:
            where = "on the step thread" if g.get("step_thread") else "on another thread"
            lines.append(f"    {_figure(g['duration_ms'])} ms at {_clock(g.get('start_ns'))}, generation "
                         f"{g.get('generation')}, {where}")
    open_step = proc.get("open_step")
    if open_step:
        lines.append(f"  ! a step has been running for {_figure(open_step.get('age_ms'))} ms "
                     f"(since {_clock(open_step.get('since_ns'))}): a hung engine? `sidecar stacks` shows where")
    return lines


def _request_lines(processes: list[dict[str, Any]]) -> list[str]:
    finished: dict[str, dict[str, Any]] = {}
    in_flight: dict[str, dict[str, Any]] = {}
    for proc in processes:  # a data-parallel engine's request is in one core; an id is counted once
        for r in proc.get("requests") or []:
            finished.setdefault(str(r.get("id")), r)
        for r in proc.get("in_flight") or []:
            in_flight.setdefault(str(r.get("id")), r)
    if not finished and not in_flight:
        return ["requests: none finished in the window, none in flight"]
    outcomes: dict[str, int] = {}
    for r in finished.values():
        outcomes[str(r.get("outcome"))] = outcomes.get(str(r.get("outcome")), 0) + 1
    told = ", ".join(f"{n} {outcome}" for outcome, n in sorted(outcomes.items(), key=lambda kv: -kv[1]))
    told = "" if set(outcomes) <= {"finished"} else told  # "2 finished (2 finished)" says nothing
    lines = [f"requests: {len(finished)} finished" + (f" ({told})" if told else "") + f", {len(in_flight)} in flight"]
    if finished:
        lines.append(f"  TTFT ms         {spread(r['ttft_ms'] for r in finished.values() if r.get('ttft_ms') is not None)}")
        lines.append(f"  end-to-end ms   {spread(r['e2e_ms'] for r in finished.values() if r.get('e2e_ms') is not None)}")
    if in_flight:
        oldest = sorted(in_flight.values(), key=lambda r: -(r.get("age_ms") or 0))
        lines.append("  in flight, oldest first")
        for r in oldest[:SLOWEST_SHOWN]:
            lines.append(f"    {_figure((r.get('age_ms') or 0) / 1000)} s  {r.get('phase') or '?':<9} prompt "
                         f"{r.get('prompt_tokens')}, output {r.get('output_tokens')}  {r.get('id')}")
        if len(oldest) > SLOWEST_SHOWN:
            lines.append(f"    … and {len(oldest) - SLOWEST_SHOWN} more (`sidecar requests` lists them all)")
    return lines


def render(answer: dict[str, Any], seconds: float | None = None) -> str:
    """The screen for one ``GET /recorder`` JSON answer (``seconds``: what was asked, for the headline)."""
    processes = answer.get("processes") or []
    summary = answer.get("summary") or {}
    since, until = answer.get("since_ns"), answer.get("until_ns")
    span = f"the last {seconds:g} s" if seconds else "the window"
    head = (f"flight recorder, {span} ({_clock(since)} to {_clock(until)} UTC): {len(processes)} process"
            f"{'es' if len(processes) != 1 else ''}, {summary.get('steps', 0):,} steps, "
            f"{summary.get('requests_finished', 0)} requests finished, {summary.get('requests_in_flight', 0)} in flight")
    blocks = [[head]]
    blocks += [_process_lines(p) for p in processes]
    blocks.append(_request_lines(processes))
    blocks.append(["the rows: `sidecar recorder --json`, or `-o rec.json.gz` for Perfetto (docs/incidents.md)"])
    return "\n\n".join("\n".join(b) for b in blocks) + "\n"
