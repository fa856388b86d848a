"""Where a capture's worst inter-token gap comes from: the gap set beside the engine's own steps.

``bench_capture_options.py`` reports one number per capture, the worst gap clients saw. To cut it one
must know *which* step made it, in which process, and what the capture was doing then. This module
reads that from what the project already records:

* the load generator's token arrivals (``LoadResult``): the worst gap inside the capture's window,
  as an interval of wall-clock time (the previous token of that stream, the late one);
* the flight recorder (``GET /recorder``): every step of the engine core and the worker with its
  start and end, on the same wall clock, so the steps the gap spans are known, with their durations
  against the process's typical working step just before the capture;
* the capture's own status, polled often while it runs: when each process reported capturing,
  exporting and done, when the sidecar began merging (the job's ``exporting``) and when it finished.

Each step the gap spans gets a name relative to the capture: ``before``, ``start`` (the working step
whose beginning started the profiler), ``recorded k``, ``stop`` (the N-th: the profiler stops at its
end, on the step thread), ``after +k`` (steps taken while the probes export and the sidecar merges),
or ``idle``. Used by ``bench_capture_options.py`` (its ``anatomy`` field and printout).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

from sidecar.devtools.traffic import LoadResult


def worst_gap(result: LoadResult, start: float, end: float) -> dict[str, float] | None:
    """The largest inter-token gap whose later token arrived within [start, end] (``time.time()``
    seconds), as ``{"ms", "from", "to"}``; None when no token arrived then."""
    best: tuple[float, float] | None = None
    for r in result.results:
        for t, gap in zip(r.arrivals[1:], r.gaps_s):
            if start <= t <= end and (best is None or gap > best[0]):
                best = (gap, t)
    if best is None:
        return None
    gap, t = best
    return {"ms": round(gap * 1e3, 2), "from": t - gap, "to": t}


class StatePoller:
    """``on_poll`` for ``SidecarClient.wait``: the first time each state of the job and of each process
    was seen (``time.time()``). With a short poll, within that poll of the real moment."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def __call__(self, status: dict[str, Any]) -> None:
        now = time.time()
        self.seen.setdefault(f"job:{status['state']}", now)
        for p in status.get("processes", ()):
            self.seen.setdefault(f"{p.get('role')}:{p.get('state')}", now)


def step_name(row: dict[str, Any], first: int | None, recorded: int) -> str:
    """A step row's place in the capture (module docstring). A row's ``step`` is the process's count
    of working steps once that step ended, so the capture's first working step has ``first + 1``."""
    if not row["working"]:
        return "idle"
    if first is None or row["step"] <= first:
        return "before"
    k = row["step"] - first
    if k > recorded:
        return f"after +{k - recorded}"
    if k == 1:
        return "start" if recorded > 1 else "start+stop"
    return "stop" if k == recorded else f"recorded {k}"


def anatomy(status: dict[str, Any], recorder: dict[str, Any], gap: dict[str, float] | None, t0: float,
            seen: dict[str, float]) -> dict[str, Any]:
    """The worst ``gap`` beside each step-driven process's steps (``recorder``: ``GET /recorder`` JSON)
    and the capture's timeline, every time in ms from ``t0`` (the start request)."""
    def rel(t: float | None) -> float | None:
        return None if t is None else round((t - t0) * 1e3, 1)

    out: dict[str, Any] = {"timeline_ms": {k: rel(v) for k, v in sorted(seen.items(), key=lambda kv: kv[1])},
                           "finished_ms": rel(status.get("finished_at")), "processes": {}}
    if gap is not None:
        out["gap"] = {"ms": gap["ms"], "from_ms": rel(gap["from"]), "to_ms": rel(gap["to"])}
    by_pid = {p.get("pid"): p for p in status.get("processes", ())}
    for view in recorder.get("processes", ()):
        proc = view.get("process") or {}
        cap = by_pid.get(proc.get("pid"))
        steps = view.get("steps") or []
        if cap is None or not steps:
            continue
        first, recorded = cap.get("first_step"), cap.get("steps_recorded") or 0
        named = [(step_name(s, first, recorded), s) for s in steps]
        before = [s["duration_ms"] for n, s in named if n == "before" and s["end_ns"] / 1e9 < t0]
        typical = statistics.median(before[-50:]) if before else None
        own: dict[str, Any] = {"typical_step_ms": typical, "first_step": first, "steps_recorded": recorded,
                               "step_thread_ms": cap.get("step_thread_ms"), "export_ms": cap.get("export_ms")}
        # The capture's own steps, and every step the gap spans, with what they took over the typical.
        rows = []
        for n, s in named:
            start, end = s["start_ns"] / 1e9, s["end_ns"] / 1e9
            in_gap = gap is not None and end >= gap["from"] and start <= gap["to"]
            if in_gap or n not in ("before", "idle") and not n.startswith("after +") or (
                    n.startswith("after +") and int(n[7:]) <= 3):
                rows.append({"name": n, "step": s["step"], "from_ms": rel(start), "ms": s["duration_ms"],
                             "batch": s.get("batch"), "prefill_tokens": s.get("prefill_tokens"),
                             "over_typical_ms": round(s["duration_ms"] - typical, 1) if typical else None,
                             "in_gap": in_gap})
        own["steps"] = rows
        if gap is not None:
            spans = [r for r in rows if r["in_gap"]]
            own["gap_steps"] = [r["name"] for r in spans]
        out["processes"][proc.get("label") or proc.get("role")] = own
    return out


def describe(a: dict[str, Any]) -> str:
    """One paragraph for the console: the gap, the steps it spans, the timeline."""
    lines = []
    gap = a.get("gap")
    if gap:
        lines.append(f"    worst gap {gap['ms']:.0f} ms, from {gap['from_ms']:.0f} to {gap['to_ms']:.0f} ms after the start request")
    for label, p in a["processes"].items():
        spans = ", ".join(f"{r['name']} {r['ms']:.0f} ms (+{r['over_typical_ms'] or 0:.0f}{_prefill(r)})"
                          for r in p["steps"] if r["in_gap"])
        own = ", ".join(f"{r['name']} {r['ms']:.0f}" for r in p["steps"] if not r["in_gap"])
        typical = p["typical_step_ms"]
        lines.append(f"    {label}: typical step {typical:.0f} ms; gap spans: {spans or '-'}; "
                     f"capture's other steps: {own or '-'}; step thread {p['step_thread_ms']} ms, export {p['export_ms']} ms"
                     if typical is not None else f"    {label}: no steps before the capture")
    timeline = ", ".join(f"{k} {v:.0f}" for k, v in a["timeline_ms"].items() if v is not None)
    lines.append(f"    timeline (ms): {timeline}; finished {a['finished_ms']}")
    return "\n".join(lines)


def _prefill(row: dict[str, Any]) -> str:
    """", prefill N tokens" for a step that scheduled prompt tokens (the worker knows them)."""
    return f", prefill {row['prefill_tokens']} tokens" if row.get("prefill_tokens") else ""


def recorder_json(fetch: Callable[[str, dict], dict], seconds: float) -> dict[str, Any]:
    """``GET /recorder`` for the last ``seconds`` (``fetch``: the client's ``request("GET", ...)``)."""
    return fetch("/recorder", {"seconds": seconds})
