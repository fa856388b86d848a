"""A remote probe's recorder dump put on the sidecar's clock (sidecar/service/incidents/recorder_clock.py) before
its rows are built (sidecar/service/incidents/recorder_view.py): every absolute time moved by the correction, durations
and unknown times left alone, the window then applied on the sidecar's clock."""

from __future__ import annotations

from sidecar.service.incidents.recorder_view import merge
from sidecar.service.incidents.recorder_clock import to_sidecar_clock

from test_recorder_view import MS, T0, core_process, gc_dump, requests_dump, steps_dump

SKEW = 5_050 * MS  # the probe's clock runs 5.05 s ahead


def remote_dump() -> dict:
    """What a probe 5.05 s ahead writes for things that happened at T0 + 10 ms ... on the true clock."""
    at = T0 + SKEW
    return {
        "steps": steps_dump([(7, at + 10 * MS, at + 30 * MS, 1, 4, 16, 0, 4, -1, -1)], open_since_ns=at + 40 * MS),
        "gc": gc_dump([(at + 12 * MS, 2 * MS, 0, 10, 1)]),
        "requests": requests_dump([("r1", at + 5 * MS, -1, at + 35 * MS, "aborted", 3, 0)]),
        "in_flight": [{"id": "r2", "arrived_ns": at + 20 * MS, "phase": "decode", "prompt_tokens": 3, "output_tokens": 1}],
    }


def test_rows_land_on_the_sidecars_clock_and_say_by_how_much():
    dump = to_sidecar_clock(remote_dump(), SKEW)
    view = merge([(core_process(), dump, None)], since_ns=T0, until_ns=T0 + 50 * MS)["processes"][0]
    assert view["clock_correction_ms"] == 5050.0
    (step,) = view["steps"]
    assert (step["start_ns"], step["end_ns"], step["duration_ms"]) == (T0 + 10 * MS, T0 + 30 * MS, 20.0)
    assert step["gc_ms"] == 2.0  # the pause moved with the step: still inside it
    assert view["gc"][0]["start_ns"] == T0 + 12 * MS
    (request,) = view["requests"]
    assert (request["arrived_ns"], request["finished_ns"], request["e2e_ms"]) == (T0 + 5 * MS, T0 + 35 * MS, 30.0)
    assert request["first_token_ns"] is None  # unknown (-1) stays unknown, not a time 5 s in the past
    assert view["in_flight"][0]["arrived_ns"] == T0 + 20 * MS and view["in_flight"][0]["age_ms"] == 30.0
    assert view["open_step"] == {"since_ns": T0 + 40 * MS, "age_ms": 10.0}


def test_uncorrected_rows_fall_outside_the_sidecars_window():
    """Why it matters: on the probe's own clock every row lies 5 s after the window the sidecar asked for."""
    view = merge([(core_process(), remote_dump(), None)], since_ns=T0, until_ns=T0 + 50 * MS)["processes"][0]
    assert view["steps"] == [] and view["gc"] == [] and view["requests"] == []
    assert view["clock_correction_ms"] == 0


def test_no_correction_leaves_the_dump_as_it_is():
    dump = remote_dump()
    assert to_sidecar_clock(remote_dump(), 0) == {**dump, "clock_correction_ns": 0}
