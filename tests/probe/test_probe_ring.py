"""The probe writes the flight recorder's step row inline (Probe.step_end) instead of calling
StepRing.end: the two must write the same rows, wrap the same way and leave the ring in the same
state, or the recorder would say something other than what happened."""

from __future__ import annotations

from pathlib import Path

import sidecar
from sidecar.probe.flight_ring import StepRing
from sidecar.probe import Probe
from sidecar_vllm.profile import VLLM_PROFILE

from .held_blocks import blocks_held

SIDECAR_CODE = str(Path(sidecar.__file__).parent / "*")

# (has_work, counts as the vLLM hooks pass them, start and end clock reads or 0 for "read here")
STEPS = [
    (True, (8, 520, 512, 8, -1, -1), 1_000, 2_000),
    (False, (-1, -1, -1, -1, 3, 0), 2_500, 2_600),
    (True, (-1, -1, -1, -1, 8, 3), 3_000, 4_000),
    (True, (2, 2, 0, 2, -1, -1), 0, 0),
]


def _probe(capacity: int) -> Probe:
    return Probe("worker", 0, profile=VLLM_PROFILE, endpoint="http://127.0.0.1:9", cuda_available=False,
                 recorder_steps=capacity)


def _through_probe(probe: Probe, steps) -> None:
    for has_work, counts, start, end in steps:
        probe.step_begin(has_work, start)
        probe.step_end(has_work, *counts, now_ns=end)


def _through_ring(ring: StepRing, steps) -> None:
    count = 0
    for has_work, counts, start, end in steps:
        ring.begin(start)
        count += has_work
        ring.end(count, has_work, *counts, now_ns=end)


def _fixed_clock(rows: dict) -> dict:
    # Steps given no clock read their own; those times differ between the two runs by design.
    return {k: v for k, v in rows.items() if k not in ("start_ns", "end_ns")}


def test_the_probe_writes_the_rows_step_ring_end_writes():
    probe, ring = _probe(16), StepRing(16)
    try:
        _through_probe(probe, STEPS)
        _through_ring(ring, STEPS)
        ours, theirs = probe.ring.dump()["steps"], ring.dump()["steps"]
        assert ours == {**theirs, "start_ns": ours["start_ns"], "end_ns": ours["end_ns"]}
        assert ours["start_ns"][:3] == theirs["start_ns"][:3] == [1_000, 2_500, 3_000]
        assert ours["end_ns"][:3] == [2_000, 2_600, 4_000]
        assert ours["step"] == [1, 1, 2, 3] and ours["working"] == [1, 0, 1, 1]
        assert ours["running"] == [-1, 3, 8, -1] and ours["prefill_tokens"] == [512, -1, -1, 0]
        # The step that was given no clock read its own, once: it starts where it ends or before.
        assert 0 < ours["start_ns"][3] <= ours["end_ns"][3]
        assert probe.ring.written == ring.written == 4
        assert probe.ring.open_since_ns == ring.open_since_ns == 0
    finally:
        probe.close()


def test_an_end_without_a_begin_starts_where_it_ends_as_in_step_ring_end():
    probe = _probe(4)
    try:
        probe.step_end(True, now_ns=5_000)
        rows = probe.ring.dump()["steps"]
        assert rows["start_ns"] == rows["end_ns"] == [5_000] and rows["batch"] == [-1]
    finally:
        probe.close()


def test_the_probe_wraps_its_ring_as_step_ring_end_does():
    steps = [(True, (n, n, 0, n, -1, -1), 10 * n + 1, 10 * n + 5) for n in range(1, 12)]
    probe, ring = _probe(5), StepRing(5)
    try:
        _through_probe(probe, steps)
        _through_ring(ring, steps)
        ours, theirs = probe.ring.dump(), ring.dump()
        assert _fixed_clock(ours["steps"]) == _fixed_clock(theirs["steps"]) and ours["steps"] == theirs["steps"]
        assert ours["steps"]["step"] == [7, 8, 9, 10, 11] and ours["written"] == 11
        # The probe counts the steps it records since its start, as the ring's caller did above.
        assert probe.steps == 11
    finally:
        probe.close()


def test_the_inline_write_holds_nothing_more_per_step():
    probe = _probe(64)
    try:
        _through_probe(probe, STEPS)  # every path warmed before counting
        def steps(first: int, count: int) -> None:
            for n in range(first, first + count):
                probe.step_begin(True, n + 1)
                probe.step_end(True, 8, 8, 0, 8, -1, -1, n + 2)

        after_some, after_more = blocks_held(steps, SIDECAR_CODE)  # all of sidecar/, the probe's and the ring's
        assert after_more <= after_some, (after_some, after_more)
    finally:
        probe.close()
