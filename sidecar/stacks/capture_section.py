"""The capture summary's ``python_stacks`` section: per process, what its stack sampler saw.

Each probe that sampled Python stacks (sidecar/stacks/sampler.py) leaves its raw samples beside
its trace; the sidecar's export summarises them (``sampled_stacks.summary``) and puts the summaries
here, keyed by process label, and the headline names the line that took the largest share of a
step thread's sampled time. The summary's rows are ranked by sampled time, not by sample count, so
"41 %" is a share of time.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

# What a process entry keeps of a process's stack summary (the rest is in the capture's JSON).
_KEPT = ("samples", "achieved_hz", "target_hz", "sampled_s", "sampler_cpu_s", "stop_reason", "error",
         "top_self", "top_total")


def section(processes: Iterable[Any]) -> dict[str, dict]:
    """``{label: {"stacks": mode, ...sampler summary}}`` for processes with Python stacks; objects with
    ``label``, ``stacks`` and ``stack_summary`` (a capture's process records)."""
    out: dict[str, dict] = {}
    for p in processes:
        mode = getattr(p, "stacks", "none")
        if mode == "none":
            continue
        entry: dict[str, Any] = {"stacks": mode}
        summary = getattr(p, "stack_summary", None) or {}
        entry.update({k: summary[k] for k in _KEPT if k in summary})
        out[p.label] = entry
    return out


def headline(stacks: dict[str, dict]) -> str | None:
    """``python: engine core 41 % in schedule (scheduler.py:345)`` for the process whose top line
    holds the largest share; None without sampled stacks."""
    best = None
    for label, entry in stacks.items():
        rows = entry.get("top_self") or []
        if rows and (best is None or rows[0]["share"] > best[1]["share"]):
            best = (label, rows[0])
    if best is None:
        return None
    label, row = best
    return (f"python: {label} {row['share'] * 100:.0f} % in {row['function']} "
            f"({os.path.basename(row['file'])}:{row['line']})")
