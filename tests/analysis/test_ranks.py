"""Ranks side by side (``ranks`` of the summary, sidecar/analysis/questions/ranks.py) on real NCCL traces.

The shared traces are single-rank, so the ranks are made from one: rank 0 is
``a100-nccl-multistream`` as recorded, rank 1 the same trace arriving ``LATE`` µs later everywhere,
with each collective kernel a quarter shorter (the last to arrive waits least), rank 2 the same as
rank 0 with every ``ProfilerStep`` range ``LONGER`` µs longer. Every expected figure is computed here
from the plain JSON, apart from the analyser.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from sidecar.analysis import analyze_path, format_report
from sidecar.analysis.questions.ranks import format_ranks
from sidecar.analysis.text import _t
from sidecar.service.export.merge import analyse_by_process, check_trace, write_merged

from .conftest import load_plain, trace_path
from .test_cli import _analyze

LATE = 1234.5
LONGER = 5000.0
DOCS = Path(__file__).resolve().parents[2] / "docs" / "analysis.md"


def _is_nccl(ev: dict) -> bool:
    return ev.get("cat") == "kernel" and "nccl" in ev.get("name", "").lower()


PID = 2910249  # the recorded process; rank r's copy runs as PID + r, as ranks on one host would


def _shifted(trace: dict, rank: int, by: float) -> dict:
    out = copy.deepcopy(trace)
    out["distributedInfo"]["rank"] = rank
    for ev in out["traceEvents"]:
        if "ts" in ev and ev.get("ph") != "M":
            ev["ts"] = ev["ts"] + by
        if ev.get("pid") == PID:
            ev["pid"] = PID + rank
    return out


@pytest.fixture(scope="module")
def original() -> dict:
    return load_plain(trace_path("a100-nccl-multistream.json.gz"))


@pytest.fixture(scope="module")
def expected(original) -> dict:
    """From the plain JSON: the steps, and the NCCL kernels launched inside one (by their runtime call)."""
    events = original["traceEvents"]
    steps = sorted((ev["ts"], ev["ts"] + ev["dur"], int(ev["name"].split("#")[1])) for ev in events
                   if ev.get("name", "").startswith("ProfilerStep#"))
    launches = {ev["args"]["correlation"]: ev["ts"] for ev in events
                if ev.get("cat") == "cuda_runtime" and "correlation" in ev.get("args", {})}
    matched = []
    for ev in events:
        if _is_nccl(ev):
            t = launches[ev["args"]["correlation"]]
            if any(start <= t <= end for start, end, _ in steps):
                matched.append(ev)
    first = {}
    for ev in matched:
        t = launches[ev["args"]["correlation"]]
        number = [n for start, end, n in steps if start <= t <= end][-1]
        first[number] = min(first.get(number, (float("inf"), 0)), (t, ev["ts"]))
    return {
        "walls": [end - start for start, end, _ in steps],
        "numbers": [n for _, _, n in steps],
        "matched": len(matched),
        "wait": sum(ev["dur"] / 4 for ev in matched),
        "nccl_time": sum(ev["dur"] for ev in events if _is_nccl(ev)),
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory, original) -> Path:
    folder = tmp_path_factory.mktemp("ranks")
    late = _shifted(original, 1, LATE)
    for ev in late["traceEvents"]:
        if _is_nccl(ev):
            ev["dur"] = ev["dur"] - ev["dur"] / 4
    slow = _shifted(original, 2, 0.0)
    for ev in slow["traceEvents"]:
        if ev.get("name", "").startswith("ProfilerStep#"):
            ev["dur"] += LONGER
    for rank, trace in enumerate((original, late, slow)):
        (folder / f"rank{rank}.json").write_text(json.dumps(trace))
    return folder


@pytest.fixture(scope="module")
def summary(folder) -> dict:
    return analyze_path(folder)


@pytest.fixture(scope="module")
def section(summary) -> dict:
    return summary["ranks"]


def test_the_late_rank_is_named_with_its_delay_at_every_step(section, expected):
    assert section["count"] == 3 and section["compared_steps"] == len(expected["numbers"]) == 3
    assert section["straggler"]["rank"] == 1
    assert section["straggler"]["late_in"] == section["straggler"]["of_steps"] == 3
    assert section["straggler"]["basis"] == "first_collective"
    assert section["straggler"]["late_by_mean_us"] == pytest.approx(LATE, abs=2e-3)
    assert section["straggler"]["late_by_max_us"] == pytest.approx(LATE, abs=2e-3)
    for row in section["steps"]:
        assert row["late_rank"] == 1 and row["basis"] == "first_collective"
        assert row["offsets_us"] == pytest.approx([0.0, LATE, 0.0], abs=2e-3)
    assert [r["late_in"] for r in section["ranks"]] == [0, 3, 0]
    assert section["notes"] == []


def test_the_headline_names_the_straggler(summary):
    parts = summary["headline"].split(" · ")
    assert "straggler rank 1 (+1.23 ms)" in parts, summary["headline"]
    assert parts.index("straggler rank 1 (+1.23 ms)") == len(parts) - 2  # just before the syncs


def test_the_slowest_rank_per_step_and_step_times(section, expected):
    assert [row["step"] for row in section["steps"]] == expected["numbers"]
    for row, wall in zip(section["steps"], expected["walls"]):
        assert row["slowest_rank"] == 2
        assert row["wall_us"] == pytest.approx([wall, wall, wall + LONGER], abs=1e-3)
    mean = sum(expected["walls"]) / 3
    assert [r["step_mean_us"] for r in section["ranks"]] == pytest.approx([mean, mean, mean + LONGER], abs=1e-3)
    assert section["ranks"][2]["step_max_us"] == pytest.approx(max(expected["walls"]) + LONGER, abs=1e-3)
    assert [r["slowest_in"] for r in section["ranks"]] == [0, 0, 3]


def test_time_waited_in_collectives(section, expected):
    # Rank 1's collectives are a quarter shorter: ranks 0 and 2 wait that quarter in each, rank 1 nothing.
    assert expected["matched"] == 21
    assert [r["matched_collectives"] for r in section["ranks"]] == [21, 21, 21]
    waits = [r["collective_wait_us"] for r in section["ranks"]]
    assert waits == pytest.approx([expected["wait"], 0.0, expected["wait"]], abs=0.01)
    assert expected["wait"] > 1000  # a figure that could be wrong
    per_step = [row["collective_wait_us"] for row in section["steps"]]
    assert [sum(col) for col in zip(*per_step)] == pytest.approx(waits, abs=0.01)


def test_overlap_per_rank_is_each_process_own(folder, section, expected):
    summary = analyze_path(folder)
    by_label = {p["label"]: p["collectives"] for p in summary["processes"]}
    for row in section["ranks"]:
        comm = by_label[row["process"]]
        assert (row["overlap_fraction"], row["exposed_us"], row["collective_time_us"]) == \
            (comm["overlap_fraction"], comm["exposed_us"], comm["time_us"])
    times = [r["collective_time_us"] for r in section["ranks"]]
    assert times == pytest.approx([expected["nccl_time"], 0.75 * expected["nccl_time"], expected["nccl_time"]], abs=0.01)
    assert 0 < section["ranks"][0]["overlap_fraction"] < 1


def test_a_merged_capture_gives_the_same_figures(tmp_path, folder, section):
    traces = []
    for rank in range(3):
        rec = SimpleNamespace(label=f"worker rank {rank} (pid {PID + rank})", role="worker", pid=PID + rank, rank=rank,
                              step_driven=True)
        traces.append(check_trace(rec, folder / f"rank{rank}.json"))
    merged = tmp_path / "trace.json.gz"
    write_merged(merged, traces)
    for summary in (analyse_by_process(merged), analyze_path(merged)):  # the sidecar's way, and a user's
        got = summary["ranks"]
        assert [r["rank"] for r in got["ranks"]] == [0, 1, 2]
        assert got["straggler"]["rank"] == 1
        assert got["straggler"]["late_by_mean_us"] == pytest.approx(LATE, abs=2e-3)
        for key in ("collective_wait_us", "step_mean_us", "slowest_in", "late_in", "matched_collectives"):
            assert [r[key] for r in got["ranks"]] == pytest.approx([r[key] for r in section["ranks"]], abs=2e-3), key


def test_without_matching_collectives_the_step_ends_decide(tmp_path, original):
    late = _shifted(original, 1, LATE)
    for ev in late["traceEvents"]:
        if _is_nccl(ev):
            ev["name"] = ev["name"].replace("AllReduce", "AllGather").replace("Broadcast", "AllGather")
    (tmp_path / "a.json").write_text(json.dumps(original))
    (tmp_path / "b.json").write_text(json.dumps(late))
    got = analyze_path(tmp_path)["ranks"]
    assert got["straggler"]["rank"] == 1 and got["straggler"]["basis"] == "step_end"
    assert got["straggler"]["late_by_mean_us"] == pytest.approx(LATE, abs=2e-3)
    assert all(row["collective_wait_us"] is None for row in got["steps"])
    assert [r["matched_collectives"] for r in got["ranks"]] == [0, 0]
    assert any("different collective kernels" in note and "4, 5, 6" in note for note in got["notes"])
    assert all(row["slowest_rank"] is None for row in got["steps"])  # equal step times: nobody is slower
    text = "\n".join(format_ranks(got, _t))
    assert "Straggler: rank 1 arrives last in 3 of 3 steps, 1.23 ms after the first rank on average" in text
    assert re.search(r"\n\s+5  slowest none \(equal\)\s+last rank 1 \+1\.23 ms \(step end\)", text), text


def test_send_recv_on_several_streams(tmp_path):
    """The other shared NCCL trace: SendRecv kernels on several streams, some launched by CUDA graphs."""
    trace = load_plain(trace_path("a100-train-queue-rank0.json.gz"))
    pid = 4515
    late = copy.deepcopy(trace)
    late["distributedInfo"]["rank"] = 1
    for ev in late["traceEvents"]:
        if "ts" in ev and ev.get("ph") != "M":
            ev["ts"] += 777.25
        if ev.get("pid") == pid:
            ev["pid"] = pid + 1
    (tmp_path / "a.json").write_text(json.dumps(trace))
    (tmp_path / "b.json").write_text(json.dumps(late))
    got = analyze_path(tmp_path)["ranks"]
    nccl = sum(1 for ev in trace["traceEvents"] if _is_nccl(ev))
    assert got["compared_steps"] == 5 and got["notes"] == []
    assert [r["matched_collectives"] for r in got["ranks"]] == [nccl, nccl] == [80, 80]
    assert got["straggler"]["rank"] == 1 and got["straggler"]["late_in"] == 5
    assert got["straggler"]["late_by_mean_us"] == pytest.approx(777.25, abs=1e-3)
    assert [r["collective_wait_us"] for r in got["ranks"]] == [0.0, 0.0]


def test_unrelated_clocks_compare_no_arrival(tmp_path, original):
    (tmp_path / "a.json").write_text(json.dumps(original))
    (tmp_path / "b.json").write_text(json.dumps(_shifted(original, 1, 3.6e9)))  # an hour later: no overlap
    summary = analyze_path(tmp_path)
    got = summary["ranks"]
    assert got["straggler"] is None and got["arrival_steps"] == 0
    assert "straggler" not in summary["headline"]  # no straggler: the headline names none
    assert all(row["late_rank"] is None and row["offsets_us"] is None for row in got["steps"])
    assert any("clocks are unrelated" in note for note in got["notes"])
    assert [r["matched_collectives"] for r in got["ranks"]] == [21, 21]  # waits need no common clock


def test_one_rank_has_no_section():
    assert "ranks" not in analyze_path(trace_path("a100-nccl-multistream.json.gz"))


def test_a_rank_claimed_twice_is_not_compared(folder, tmp_path):
    """Two data-parallel replicas each have a rank 0: their collectives never waited on each other."""
    for name in ("rank0.json", "rank1.json"):
        trace = json.loads((folder / name).read_text())
        trace["distributedInfo"]["rank"] = 0
        (tmp_path / name).write_text(json.dumps(trace))
    summary = analyze_path(tmp_path)
    assert "ranks" not in summary
    assert any("rank 0 is claimed by 2 processes" in w for w in summary["warnings"]), summary["warnings"]


def test_analyze_prints_ranks_side_by_side(folder, section):
    done = _analyze(str(folder))
    assert done.returncode == 0, done.stderr
    text = done.stdout.split("== Ranks side by side (3 ranks, 3 steps in common)")[1]
    assert re.search(r"Straggler: rank 1 arrives last in 3 of 3 steps, 1\.23 ms after the first rank on average", text)
    assert re.search(r"\n\s+4  slowest rank 2 .* last rank 1 \+1\.23 ms \(first collective\)", text), text
    assert "\n".join(format_ranks(section, _t)) in format_report(analyze_path(folder))


def test_every_ranks_field_is_documented(section):
    documented = set(re.findall(r"`([a-z_A-Z]+)`", DOCS.read_text(encoding="utf-8")))
    found: set[str] = {"ranks"}

    def keys(value):
        if isinstance(value, dict):
            for key, item in value.items():
                found.add(key)
                keys(item)
        elif isinstance(value, list):
            for item in value:
                keys(item)

    keys(section)
    assert not sorted(found - documented)
