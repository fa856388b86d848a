"""What a probe enforces itself, whatever the sidecar asks: where it writes (only
``<trace root>/captures/<id>/raw/``), how many steps a job may take, how long a window may record,
and how large one trace file may be. Settings come from the engine's environment; a bad value is
an error naming the variable and the default is used."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time

import pytest

from sidecar.common import config
from sidecar.probe import Probe
from sidecar.common.protocol import Arm, Begin, CaptureReport, CaptureSpec, Stop, SyncArm, SyncReport, SyncSpec
from sidecar.common.protocol_codec import ProtocolError, decode_from_sidecar

from .test_probe_messages import Sent, steps


@pytest.fixture
def root(tmp_path, monkeypatch):
    path = tmp_path / "probe-root"
    monkeypatch.setenv(config.ENV_TRACE_DIR, str(path))
    return path


def make_probe(role="worker", rank=0, **kwargs):
    probe = Probe(role, rank, endpoint="http://127.0.0.1:9", cuda_available=False, **kwargs)
    sent = Sent()
    probe._link.send = sent.send
    return probe, sent


def run_until_finished(probe, timeout=20.0, step_s=0.0):
    deadline = time.monotonic() + timeout
    while probe._capture is not None and time.monotonic() < deadline:
        steps(probe, 1)
        if step_s:
            time.sleep(step_s)
    assert probe._capture is None, "the capture did not finish"


def wait_final(sent, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        final = [m for m in sent if m.state in ("done", "failed")]
        if final:
            return final[-1]
        time.sleep(0.02)
    raise AssertionError(f"no final report: {sent}")


# -- where a probe writes -------------------------------------------------------------------------------
def test_a_capture_is_written_under_the_probes_own_root_whatever_the_message_says(root, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    probe, sent = make_probe()
    # A message from an older sidecar (or anyone) naming a directory: the field is not the probe's to follow.
    probe._on_message(decode_from_sidecar(json.dumps(
        {"type": "arm", "spec": {"id": "c1", "steps": 2, "out_dir": str(elsewhere)}})))
    probe._on_message(Begin(job_id="c1", start_step=0))
    run_until_finished(probe)
    done = wait_final(sent)
    assert done.state == "done", done
    expected = root / "captures" / "c1" / "raw" / f"{probe.identity.probe_file_stem}.json"
    assert done.file == str(expected) and expected.is_file() and done.bytes == expected.stat().st_size
    assert not elsewhere.exists()


def test_the_default_root_is_beside_the_token_file(monkeypatch, tmp_path):
    monkeypatch.delenv(config.ENV_TRACE_DIR, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert config.trace_dir() == tmp_path / "run" / "inference-sidecar" / "traces"
    assert config.trace_dir().parent == config.default_token_file().parent
    monkeypatch.setenv(config.ENV_TRACE_DIR, str(tmp_path / "mine"))
    assert config.trace_dir() == tmp_path / "mine"


@pytest.mark.parametrize("job_id", ["..", ".", "../x", "a/b", "", "-x", "x" * 65, "c1\n", "c.1"])
def test_job_ids_that_could_be_path_components_do_not_decode(job_id):
    with pytest.raises(ProtocolError):
        decode_from_sidecar(json.dumps({"type": "arm", "spec": {"id": job_id, "steps": 1}}))
    with pytest.raises(ProtocolError):
        decode_from_sidecar(json.dumps({"type": "begin", "job_id": job_id, "start_step": 0}))


def test_the_ids_the_sidecar_makes_still_decode():
    from sidecar.service.jobs.model import CAPTURE, SCAN

    for job_id in (CAPTURE.new_id(), SCAN.new_id(), "20261121-044636-549db8", "s20261121-051500-0a1b2c"):
        assert decode_from_sidecar(json.dumps({"type": "stop", "job_id": job_id})).job_id == job_id


def test_a_root_whose_captures_folder_leads_elsewhere_is_refused(root, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root.mkdir()
    os.symlink(outside, root / "captures")
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="c1", steps=1)))
    assert probe._capture is None
    [report] = sent
    assert report.state == "failed" and "outside" in report.error and str(root) in report.error
    assert list(outside.iterdir()) == []


# -- steps ----------------------------------------------------------------------------------------------
def test_an_arm_over_the_step_limit_is_refused_naming_the_limit(root, monkeypatch):
    monkeypatch.setenv(config.ENV_PROBE_MAX_STEPS, "5")
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="c1", steps=6)))
    probe._on_message(SyncArm(spec=SyncSpec(id="s1", steps=6)))
    assert probe._capture is None and probe._scan is None
    capture, scan = sent
    assert isinstance(capture, CaptureReport) and isinstance(scan, SyncReport)
    for report in (capture, scan):
        assert report.state == "failed"
        assert "SIDECAR_PROBE_MAX_STEPS=5" in report.error and "6 steps" in report.error
    probe._on_message(Arm(spec=CaptureSpec(id="c2", steps=5)))  # at the limit: armed
    assert sent[-1] == CaptureReport(job_id="c2", state="armed", steps_seen=0)


def test_the_default_step_limit_is_the_sidecars_default(root):
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="c1", steps=config.DEFAULT_MAX_STEPS + 1)))
    assert sent[0].state == "failed" and f"SIDECAR_PROBE_MAX_STEPS={config.DEFAULT_MAX_STEPS}" in sent[0].error


# -- duration -------------------------------------------------------------------------------------------
def test_a_capture_that_runs_past_the_duration_limit_ends_at_the_next_step_naming_it(root, monkeypatch):
    monkeypatch.setenv(config.ENV_PROBE_MAX_CAPTURE_S, "0.3")
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="c1", steps=1000)))
    probe._on_message(Begin(job_id="c1", start_step=0))
    started = time.monotonic()
    run_until_finished(probe, step_s=0.01)
    took = time.monotonic() - started
    done = wait_final(sent)
    assert done.state == "done" and 0 < done.steps_recorded < 1000
    assert "SIDECAR_PROBE_MAX_CAPTURE_S" in done.stop_reason and "0.3" in done.stop_reason
    assert 0.3 <= took < 5


def test_a_scan_has_the_same_duration_limit(root, monkeypatch):
    monkeypatch.setenv(config.ENV_PROBE_MAX_CAPTURE_S, "0.2")
    probe, sent = make_probe()
    probe._on_message(SyncArm(spec=SyncSpec(id="s1", steps=1000)))
    probe._on_message(Begin(job_id="s1", start_step=0))
    deadline = time.monotonic() + 20
    while probe._scan is not None and time.monotonic() < deadline:
        steps(probe, 1)
        time.sleep(0.01)
    done = sent[-1]
    assert done.state == "done" and done.steps_recorded < 1000 and "SIDECAR_PROBE_MAX_CAPTURE_S" in done.stop_reason


def test_the_api_servers_window_closes_at_the_duration_limit(root, monkeypatch):
    monkeypatch.setenv(config.ENV_PROBE_MAX_CAPTURE_S, "0.3")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        probe, sent = make_probe("api_server", None, loop=loop)
        probe._on_message(Arm(spec=CaptureSpec(id="w1", steps=3)))  # no stop will come
        done = wait_final(sent)
        probe._on_message(Stop(job_id="w1", reason="steps recorded"))  # late: changes nothing
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
    assert done.state == "done" and "SIDECAR_PROBE_MAX_CAPTURE_S" in done.stop_reason
    assert done.file.startswith(str(root / "captures" / "w1" / "raw"))


# -- bytes ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stacks", ["none", "sampled"])
def test_a_trace_file_over_the_size_limit_is_deleted_and_the_process_fails_naming_it(root, monkeypatch, stacks):
    monkeypatch.setenv(config.ENV_PROBE_MAX_TRACE_MB, "0.001")  # about 1 kB: any trace is larger
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="c1", steps=2, stacks=stacks)))
    probe._on_message(Begin(job_id="c1", start_step=0))
    run_until_finished(probe)
    final = wait_final(sent)
    assert final.state == "failed" and "SIDECAR_PROBE_MAX_TRACE_MB" in final.error, final
    # Nothing left but the probe's marker (trace_root.make_marker), which lives as long as the probe.
    assert [p for p in root.rglob("*") if p.is_file() and p.parent.name != "probes"] == []


def test_a_samples_file_counts_with_its_trace_against_the_size_limit():
    from sidecar.probe.capture.limits import ProbeLimits

    limits = ProbeLimits(max_trace_mb=1)
    assert limits.samples_problem(2**19, 2**19) is None
    problem = limits.samples_problem(2**19, 2**19 + 1)
    assert "SIDECAR_PROBE_MAX_TRACE_MB=1 MiB" in problem and problem.startswith("samples file of 0.5 MiB")


# -- settings -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, value", [
    (config.ENV_PROBE_MAX_STEPS, "abc"), (config.ENV_PROBE_MAX_STEPS, "0"), (config.ENV_PROBE_MAX_STEPS, "2.5"),
    (config.ENV_PROBE_MAX_CAPTURE_S, "-1"), (config.ENV_PROBE_MAX_CAPTURE_S, "nan"),
    (config.ENV_PROBE_MAX_TRACE_MB, "lots"), (config.ENV_PROBE_MAX_TRACE_MB, "inf"),
])
def test_a_bad_setting_is_an_error_naming_the_variable_and_the_default_is_used(monkeypatch, caplog, name, value):
    from sidecar.probe.capture.limits import ProbeLimits

    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.ERROR):
        limits = ProbeLimits.from_environment()
    assert limits == ProbeLimits()
    [said] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert name in said and value in said


def test_limits_defaults():
    from sidecar.probe.capture.limits import ProbeLimits

    limits = ProbeLimits()
    assert limits.max_steps == config.DEFAULT_MAX_STEPS
    assert limits.max_trace_bytes == config.DEFAULT_MAX_CAPTURE_MB * 2**20
    assert limits.max_capture_s == config.DEFAULT_PROBE_MAX_CAPTURE_S
