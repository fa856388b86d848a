"""Allowlist, baseline comparison, merging across processes, and the scan's step interface."""

from __future__ import annotations

import json

import pytest
import torch

import sync_kinds
from sidecar.common.protocol import SyncArm, SyncReport
from sidecar.common.protocol_codec import ProtocolError, decode_from_sidecar, encode
from sidecar.syncs import (
    ENV_ALLOWLIST,
    AllowEntry,
    Allowlist,
    SyncDetector,
    SyncScan,
    SyncSpec,
    from_environment,
    load_entries,
    merge_reports,
    new_sites,
)

X = sync_kinds._x()


def site(path="pkg/model.py", line=10, function="forward", op="item", **extra):
    base = {
        "file": "/abs/" + path, "path": path, "line": line, "function": function, "op": op, "phase": "forward",
        "count": 2, "count_per_step": 1.0, "blocked_us": 3.0, "first_step": 0, "last_step": 1,
        "classification": "hidden", "reason": "",
    }
    return {**base, **extra}


def run_scan(spec, steps, allowlist=None, step_fn=lambda i: sync_kinds.item(X), start_step=0):
    """Drive a scan like a probe: ``steps`` is a list of has_work flags; the probe's working-step
    count numbers the steps; the sidecar's ``begin`` has arrived with ``start_step``."""
    messages = []
    scan = SyncScan(spec, messages.append, allowlist=allowlist, detector=SyncDetector(treat_cpu_as_device=True))
    scan.begin(start_step)
    working = 0
    for i, has_work in enumerate(steps):
        scan.on_step_begin(has_work, working)
        step_fn(i)
        working += has_work
        scan.on_step_end(has_work)
        if scan.finished:
            break
    assert all(isinstance(m, SyncReport) for m in messages)
    return scan, messages


# -- allowlist ------------------------------------------------------------------------------------
def test_allow_entry_matching():
    s = site("vllm/v1/worker/gpu_model_runner.py", 7190, "_to_list", "tolist")
    assert AllowEntry("vllm/v1/worker/gpu_model_runner.py", "_to_list").matches(s)
    assert AllowEntry("vllm/*/gpu_model_runner.py").matches(s)
    assert AllowEntry("gpu_model_runner.py").matches(s)  # against the absolute path's tail
    assert not AllowEntry("vllm/v1/worker/gpu_model_runner.py", "execute_model").matches(s)
    assert not AllowEntry("vllm/v1/worker/gpu_model_runner.py", op="item").matches(s)
    assert AllowEntry("vllm/v1/worker/gpu_model_runner.py", line=7190).matches(s)
    assert not AllowEntry("vllm/v1/worker/gpu_model_runner.py", line=7191).matches(s)


def test_the_core_has_no_entries_and_vllms_profile_covers_its_sampled_token_transfer():
    from sidecar_vllm.profile import VLLM_PROFILE

    assert Allowlist().entries == () and from_environment().entries == ()
    allowlist = Allowlist(VLLM_PROFILE.allow_entries)
    for path in ("vllm/v1/worker/gpu_model_runner.py", "vllm/v1/worker/cpu_model_runner.py"):
        cls, reason = allowlist.classify(site(path, 1, "_to_list", "tolist"))
        assert cls == "expected" and "sampled token" in reason
    assert allowlist.classify(site())[0] == "hidden"


def test_user_entries_from_a_file(tmp_path, monkeypatch, caplog):
    listed = tmp_path / "allow.json"
    listed.write_text(json.dumps([{"path": "pkg/model.py", "function": "forward", "op": "item", "reason": "ours"}]))
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"allow": [{"path": "pkg/*.py", "line": 10}]}))
    assert load_entries(listed) == [AllowEntry("pkg/model.py", "forward", "item", None, "ours")]
    assert load_entries(wrapped) == [AllowEntry("pkg/*.py", line=10)]

    engines = [AllowEntry("engine/runner.py", "_to_list", reason="the engine's")]
    monkeypatch.setenv(ENV_ALLOWLIST, str(listed))
    allowlist = from_environment(base=engines)
    assert allowlist.classify(site()) == ("expected", "ours")
    assert allowlist.classify(site("engine/runner.py", 1, "_to_list", "tolist")) == ("expected", "the engine's")

    bad = tmp_path / "bad.json"
    for text in ("not json", '{"allow": 3}', '[{"function": "f"}]', '[{"path": "a", "colour": 1}]', '[{"path": "a", "line": "7"}]'):
        bad.write_text(text)
        with pytest.raises(ValueError, match="bad.json"):
            load_entries(bad)
    monkeypatch.setenv(ENV_ALLOWLIST, str(bad))
    assert from_environment(base=engines).entries == tuple(engines)  # logged, the engine's kept
    assert ENV_ALLOWLIST in caplog.text


def test_scan_classifies_with_the_allowlist():
    allowlist = Allowlist([AllowEntry("sync_kinds.py", "item", reason="on purpose")])

    def step(i):
        sync_kinds.item(X)
        sync_kinds.tolist(X)

    _, messages = run_scan(SyncSpec(id="a", steps=2), [True, True], allowlist, step)
    sites = messages[-1].sites
    assert [(s["op"], s["classification"], s["reason"]) for s in sites] == [
        ("tolist", "hidden", ""), ("item", "expected", "on purpose"),
    ]


# -- baseline -------------------------------------------------------------------------------------
def test_baseline_shows_only_new_sites():
    baseline = {"sites": [site(), site(op="tolist", line=12)]}
    current = [site(), site(op="tolist", line=14), site(op="nonzero", line=20)]
    assert [(s["op"], s["line"]) for s in new_sites(current, baseline)] == [("tolist", 14), ("nonzero", 20)]
    assert [(s["op"], s["line"]) for s in new_sites(current, baseline, match_line=False)] == [("nonzero", 20)]
    assert new_sites(current, baseline["sites"] + current) == []


def test_saved_report_round_trips_as_a_baseline(tmp_path):
    _, first = run_scan(SyncSpec(id="a", steps=1), [True])
    path = tmp_path / "baseline.json"
    path.write_text(encode(first[-1]))

    def step(i):
        sync_kinds.item(X)
        sync_kinds.nonzero(X)

    _, second = run_scan(SyncSpec(id="b", steps=1), [True], step_fn=step)
    assert [s["op"] for s in new_sites(second[-1].sites, json.loads(path.read_text()))] == ["nonzero"]


# -- merge ----------------------------------------------------------------------------------------
def test_merge_reports_of_several_processes():
    a = {"type": "sync", "scan_id": "s", "process": "worker rank 0", "steps_recorded": 4,
         "sites": [site(count=4, count_per_step=1.0, blocked_us=2.0, first_step=0, last_step=3, classification="expected", reason="r"),
                   site(op="nonzero", line=20)]}
    b = {"type": "sync", "scan_id": "s", "process": "worker rank 1", "steps_recorded": 3,
         "sites": [site(count=6, count_per_step=2.0, blocked_us=5.0, first_step=1, last_step=2, classification="hidden")]}
    merged = merge_reports([a, b])
    assert merged["scan_id"] == "s" and merged["processes"] == 2 and merged["steps_recorded"] == 3
    item = next(s for s in merged["sites"] if s["op"] == "item")
    assert (item["count"], item["count_per_step"], item["blocked_us"]) == (10, 3.0, 7.0)
    assert (item["first_step"], item["last_step"]) == (0, 3)
    assert item["processes"] == ["worker rank 0", "worker rank 1"]
    assert item["classification"] == "hidden"  # hidden anywhere is hidden
    assert len(merged["sites"]) == 2
    json.dumps(merged)


# -- the scan's step interface --------------------------------------------------------------------
def test_scan_records_exactly_n_working_steps():
    seen_steps = []

    def step(i):
        seen_steps.append(i)
        sync_kinds.item(X)

    # begun at working step 1: the first working step is not scanned; idle steps are neither
    # scanned nor counted.
    scan, messages = run_scan(SyncSpec(id="n", steps=3), [False, True, False, True, True, False, True, True],
                              step_fn=step, start_step=1)
    assert scan.finished
    assert [m.state for m in messages] == ["scanning", "done"]
    done = messages[-1]
    assert (done.steps_recorded, done.job_id, done.first_step) == (3, "n", 1)
    (only,) = done.sites
    assert (only["op"], only["count"], only["count_per_step"], only["first_step"], only["last_step"]) == ("item", 3, 1.0, 0, 2)
    assert (only["file"], only["function"], only["phase"]) == (sync_kinds.FILE, "item", "other")
    assert seen_steps == [0, 1, 2, 3, 4, 5, 6]
    encode(done)
    assert "item" not in torch.Tensor.__dict__


def test_an_armed_scan_waits_for_begin_then_stop_before_the_first_step_fails():
    messages = []
    scan = SyncScan(SyncSpec(id="s", steps=2), messages.append)
    for step in range(3):  # armed, not begun: working steps go by unscanned
        scan.on_step_begin(True, step)
        scan.on_step_end(True)
    assert scan.state == "armed" and messages == []
    assert scan.request_stop("sidecar disconnected") is True
    assert scan.finished
    assert messages[-1].state == "failed" and "sidecar disconnected" in messages[-1].error
    assert messages[-1].stop_reason == "sidecar disconnected"


def test_stop_while_scanning_reports_what_was_seen():
    messages = []
    scan = SyncScan(SyncSpec(id="s", steps=10), messages.append, detector=SyncDetector(treat_cpu_as_device=True))
    scan.begin(0)
    for i in range(2):
        scan.on_step_begin(True, i)
        sync_kinds.tolist(X)
        scan.on_step_end(True)
    assert scan.request_stop("stopped") is False
    assert not scan.finished
    scan.on_step_begin(True, 2)  # the next step ends it, on the step thread
    assert scan.finished
    done = messages[-1]
    assert (done.state, done.steps_recorded, done.stop_reason) == ("done", 2, "stopped")
    assert [s["count"] for s in done.sites] == [2]
    assert "tolist" not in torch.Tensor.__dict__


def test_a_detector_that_fails_to_arm_fails_the_scan():
    class Broken(SyncDetector):
        def arm(self):
            raise RuntimeError("boom")

    messages = []
    scan = SyncScan(SyncSpec(id="s", steps=1), messages.append, detector=Broken(treat_cpu_as_device=True))
    scan.begin(0)
    scan.on_step_begin(True, 0)
    scan.on_step_end(True)
    assert scan.finished
    assert messages == [SyncReport(job_id="s", state="failed", steps_recorded=0, first_step=0,
                                   treat_cpu_as_device=True, error="sync detector failed to arm: boom")]


def test_spec_round_trip_and_validation():
    spec = SyncSpec(id="x", steps=5)
    assert decode_from_sidecar(encode(SyncArm(spec=spec))) == SyncArm(spec=spec)
    for bad in ({"id": "x", "steps": 0}, {"id": "x", "steps": "2"}, {"steps": 2}, {"id": "x y", "steps": 2}):
        with pytest.raises(ProtocolError):
            decode_from_sidecar(json.dumps({"type": "sync_arm", "spec": bad}))
