"""Replicas side by side: per replica the figures a person compares first, the median of each, and
the outlier.

The figures come from what a sidecar already serves: a capture's summary (docs/analysis.md: engine
steps as its headline counts them, GPU busy, the top kernel or CPU op, syncs) and the flight
recorder (docs/api.md, ``GET /recorder``: working steps, finished requests' ``ttft_ms``).

The outlier: the measure is the step time (mean of a complete engine step), for it is what every
replica has; the outlier is the replica farthest from the median by ratio (``value / median`` or its
inverse, whichever is above 1), named when that ratio is at least ``OUTLIER_RATIO`` and at least two
replicas have the measure. One measure and one rule, so a script can act on ``outlier`` alone.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Iterable

OUTLIER_RATIO = 1.25
MEASURE = "step_ms"  # the outlier's measure, in every row


def p99(values: Iterable[float]) -> float | None:
    """The 99th percentile by nearest rank (a value that was seen); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def ttft_p99_ms(recorder: dict[str, Any] | None) -> tuple[float | None, int]:
    """(p99 of the finished requests' ``ttft_ms``, how many had one) over every process of a recorder
    answer; (None, 0) when it holds no request (an engine without request telemetry)."""
    values = [r["ttft_ms"] for p in (recorder or {}).get("processes", []) for r in p.get("requests") or []
              if r.get("ttft_ms") is not None]
    return p99(values), len(values)


def capture_row(status: dict[str, Any], summary: dict[str, Any] | None) -> dict[str, Any]:
    """A replica's figures from its capture's status (``GET /profile/{id}``) and summary."""
    row: dict[str, Any] = {"capture": status.get("id"), "state": status.get("state"), "reason": status.get("reason"),
                           "stored": status.get("stored"), "headline": status.get("headline"),
                           "steps": None, MEASURE: None, "gpu_busy": None, "top": None, "top_kind": None,
                           "syncs": None, "sync_blocked_ms": None}
    if not summary:
        return row
    step_rows = summary.get("steps") or []
    if step_rows:
        from ..analysis.summary import engine_steps  # the headline's own count and mean (imports numpy: here only)

        count, mean_us, _ = engine_steps(step_rows)
        row["steps"] = count
        row[MEASURE] = None if mean_us is None else round(mean_us / 1000, 3)
    gpu = summary.get("gpu") or {}
    if gpu.get("kernel_count"):
        row["gpu_busy"] = gpu.get("busy_fraction")
        top = (gpu.get("top_kernels") or [{}])[0]
        row["top"], row["top_kind"] = top.get("name"), "kernel"
    else:
        top = ((summary.get("cpu") or {}).get("top_ops") or [{}])[0]
        row["top"], row["top_kind"] = top.get("name"), "op" if top.get("name") else None
    syncs = summary.get("syncs") or []
    row["syncs"] = sum(s.get("count", 0) for s in syncs)
    row["sync_blocked_ms"] = round(sum(s.get("total_us", 0.0) for s in syncs) / 1000, 3)
    return row


def recorder_row(recorder: dict[str, Any]) -> dict[str, Any]:
    """A replica's figures from its flight recorder alone: its working steps (every step-driven
    process: they take the same steps) and its finished requests."""
    durations = [s["duration_ms"] for p in recorder.get("processes", []) for s in p.get("steps") or []
                 if s.get("working") and s.get("duration_ms") is not None]
    summary = recorder.get("summary") or {}
    gc = sum((p.get("gc_totals") or {}).get("step_thread_pause_ms") or 0.0 for p in recorder.get("processes", []))
    return {"steps": len(durations),
            MEASURE: round(statistics.fmean(durations), 3) if durations else None,
            "step_p99_ms": p99(durations),
            "slowest_step_ms": summary.get("slowest_step_ms"),
            "gc_step_thread_ms": round(gc, 3),
            "requests_finished": summary.get("requests_finished"),
            "requests_in_flight": summary.get("requests_in_flight"),
            "errors": [f"{p['process'].get('label')}: {p['error']}" for p in recorder.get("processes", [])
                       if p.get("error") and isinstance(p.get("process"), dict)]}


def outlier(replicas: list[dict[str, Any]], ratio: float = OUTLIER_RATIO, measure: str = MEASURE) -> dict[str, Any] | None:
    """The replica farthest from the median of ``measure`` by ratio, when that ratio is ``ratio`` or
    more; None otherwise (fewer than two replicas with the measure, or none far enough)."""
    having = [r for r in replicas if isinstance(r.get(measure), (int, float)) and r[measure] > 0]
    if len(having) < 2:
        return None
    median = statistics.median(r[measure] for r in having)

    def distance(r: dict[str, Any]) -> float:
        return max(r[measure] / median, median / r[measure])

    far = max(having, key=distance)
    if distance(far) < ratio:
        return None
    return {"target": far["target"], "measure": measure, "value": far[measure], "median": round(median, 3),
            "ratio": round(distance(far), 3), "direction": "slower" if far[measure] > median else "faster",
            "threshold": ratio}


def describe_outlier(found: dict[str, Any] | None, count: int, ratio: float = OUTLIER_RATIO) -> str:
    """One line: who, how far from the median, which way. ``count``: replicas with a step time."""
    if found is None:
        return f"no outlier: every replica's step time is within {ratio:g}× of the median" if count >= 2 \
            else "no outlier: fewer than two replicas have a step time"
    pct = (found["value"] / found["median"] - 1) * 100
    return (f"outlier: {found['target']}, step time {found['value']:.2f} ms, {pct:+.0f}% against the median "
            f"{found['median']:.2f} ms ({found['ratio']:.2f}× {found['direction']})")
