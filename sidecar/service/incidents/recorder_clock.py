"""A probe's flight-recorder dump put on the sidecar's clock, by the rule the capture's merge follows.

Every time in a dump is the probe's own ``time.time_ns()`` (sidecar/probe/flight_ring.py); on another host
that clock may be seconds off the sidecar's, and ``/recorder`` merges every process's rows on one
timeline and picks them by a window read on the sidecar's clock. So the times of a process whose
measured offset exceeds its uncertainty (sidecar/service/channel/clock_sync.py: ``correction_ns``, never on one host) are
moved by that offset, as its trace is in a capture's merged trace (sidecar/service/export/raw_trace.py ``aligned_base_ns``),
before the rows are built. Durations do not change; an unknown time (-1) or an absent one (0) stays.
"""

from __future__ import annotations

from typing import Any

# The dump's absolute times, by ring (flight_ring.py: STEP_FIELDS, GC_FIELDS, REQUEST_FIELDS).
_STEP_TIMES = ("start_ns", "end_ns")
_GC_TIMES = ("start_ns",)
_REQUEST_TIMES = ("arrived_ns", "first_token_ns", "finished_ns")
CORRECTION_KEY = "clock_correction_ns"  # what was subtracted, kept in the dump for recorder_view


def to_sidecar_clock(dump: dict[str, Any], correction_ns: int) -> dict[str, Any]:
    """``dump`` with ``correction_ns`` subtracted from every absolute time (in place; returned), and
    the correction noted under ``CORRECTION_KEY``. A correction of 0 leaves the times as they are."""
    dump[CORRECTION_KEY] = correction_ns
    if not correction_ns:
        return dump
    steps = dump.get("steps")
    if isinstance(steps, dict):
        _shift_columns(steps.get("steps"), _STEP_TIMES, correction_ns)
        if steps.get("open_since_ns"):
            steps["open_since_ns"] -= correction_ns
    _shift_columns(dump.get("gc"), _GC_TIMES, correction_ns)
    _shift_columns(dump.get("requests"), _REQUEST_TIMES, correction_ns)
    for entry in dump.get("in_flight") or ():
        if isinstance(entry, dict) and isinstance(entry.get("arrived_ns"), int) and entry["arrived_ns"] > 0:
            entry["arrived_ns"] -= correction_ns
    return dump


def _shift_columns(columns: Any, names: tuple[str, ...], correction_ns: int) -> None:
    if not isinstance(columns, dict):
        return
    for name in names:
        values = columns.get(name)
        if isinstance(values, list):
            # A time not known (-1: a request without a first token) or not set (0) is no time.
            columns[name] = [v - correction_ns if isinstance(v, int) and v > 0 else v for v in values]
