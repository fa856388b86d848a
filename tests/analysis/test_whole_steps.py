"""A trace that says its step ranges are whole (sidecar/common/phases.py ``whole_steps``: the sidecar's probe
opens and closes them at step boundaries only) has no partial step, however short its last range;
any other trace's last range is still judged by its length (issue 28: a loaded host or a
tensor-parallel worker that waits between steps made the probe's last step read as cut off)."""

from __future__ import annotations

from sidecar.analysis import analyze_path, format_report

from . import synth as S

# Each range but the last holds the idle time until the next step began; the last ends with its step.
DURATIONS = [2000.0, 2000.0, 600.0]  # 600 < half the median of the others (1000): cut off by length
TABLE = {"forward": "forward", "update": "update"}


def _process(pid: int, name: str, durations=DURATIONS, last_update: bool = True) -> list:
    events, t = [S.process_name(pid, name)], 0.0
    for n, dur in enumerate(durations):
        events.append(S.step(n, t, dur, pid=pid, tid=pid))
        events.append(S.op("forward", t + 10, 300, cat="user_annotation", pid=pid, tid=pid))
        if n < len(durations) - 1 or last_update:
            events.append(S.op("update", t + 400, 100, cat="user_annotation", pid=pid, tid=pid))
        t += dur
    return events


def test_a_probe_trace_s_short_last_step_is_a_whole_step(tmp_path):
    member = {"inference_sidecar": {"whole_steps": True}}
    summary = analyze_path(S.write(tmp_path / "w.json", _process(1, "worker rank 0 (pid 1)"), **member))
    assert [s["partial"] for s in summary["steps"]] == [False, False, False]
    assert "3 steps, 1.53 ms/step · " in summary["headline"], summary["headline"]  # (2000 + 2000 + 600) / 3
    assert "cut off" not in summary["headline"] and "cut off" not in format_report(summary)


def test_without_the_member_the_short_last_step_is_still_cut_off(tmp_path):
    summary = analyze_path(S.write(tmp_path / "plain.json", _process(1, "worker rank 0 (pid 1)")))
    assert [s["partial"] for s in summary["steps"]] == [False, False, True]
    assert "3 steps, 2.00 ms/step (1 cut off, left out)" in summary["headline"], summary["headline"]
    member = {"inference_sidecar": {"whole_steps": False}}  # a probe that could not say it: the same
    summary = analyze_path(S.write(tmp_path / "false.json", _process(1, "worker rank 0 (pid 1)"), **member))
    assert [s["partial"] for s in summary["steps"]] == [False, False, True]


def test_anatomy_takes_no_whole_step_for_partial_by_either_rule(tmp_path):
    # Length rule: the last step is short. Phase rule: a long last step without the update every other has.
    for name, durations in (("short", DURATIONS), ("lacking", [2000.0, 2000.0, 1900.0])):
        events = _process(1, "worker rank 0 (pid 1)", durations, last_update=False)
        whole = analyze_path(S.write(tmp_path / f"{name}-whole.json", events,
                                     inference_sidecar={"phase_ranges": TABLE, "whole_steps": True}))["anatomy"]
        (p,) = whole["processes"]
        assert [s["partial"] for s in p["steps"]] == [False, False, False], name
        assert (p["complete_steps"], p["partial_steps"]) == (3, 0), name
        assert p["mean_us"]["update"] == round(200 / 3, 3), name  # the last step's 0 counted in
        foreign = analyze_path(S.write(tmp_path / f"{name}.json", events,
                                       inference_sidecar={"phase_ranges": TABLE}))["anatomy"]
        (p,) = foreign["processes"]
        assert [s["partial"] for s in p["steps"]] == [False, False, True], name
        assert p["mean_us"]["update"] == 100, name


def test_a_merged_trace_says_it_per_process(tmp_path):
    # Process 1's probe said its ranges are whole; process 2's trace did not (a foreign trace).
    events = _process(1, "worker rank 0 (pid 1)") + _process(2, "worker rank 1 (pid 2)")
    member = {"inference_sidecar": {"processes": [{"pid": 1}, {"pid": 2}], "whole_steps_pids": [1]}}
    summary = analyze_path(S.write(tmp_path / "merged.json", events, **member))
    partial = {p["pid"]: [s["partial"] for s in p["steps"]] for p in summary["processes"]}
    assert partial == {1: [False, False, False], 2: [False, False, True]}
    assert "(1 cut off, left out)" in summary["headline"], summary["headline"]
    # A pid written as text is not the process's pid.
    member["inference_sidecar"]["whole_steps_pids"] = ["1"]
    summary = analyze_path(S.write(tmp_path / "text.json", events, **member))
    partial = {p["pid"]: [s["partial"] for s in p["steps"]] for p in summary["processes"]}
    assert partial[1] == [False, False, True]
