"""The probe's side of the typed protocol: what it does with each message from the sidecar, what it
reports, and how its engine profile reaches the jobs it builds. The probe is not started: the test
stands in for its link."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from sidecar.engine import GENERIC, EngineProfile, Role
from sidecar.probe import Probe
from sidecar.common.protocol import (
    file_name_part,
    Arm,
    Begin,
    CaptureReport,
    CaptureSpec,
    Heartbeat,
    Stop,
    SyncArm,
    SyncReport,
    SyncSpec,
)
from sidecar.common.protocol_codec import decode_from_probe, encode
from sidecar.syncs.allowlist import AllowEntry
from sidecar.syncs.sites import FORWARD, PhaseRule


class Sent(list):
    """Stands in for the probe's link: every message the probe sends, in order."""

    def send(self, msg):
        encode(msg)  # every report must be encodable as it is
        self.append(msg)

    def of(self, kind):
        return [m for m in self if isinstance(m, kind)]


def make_probe(role="worker", rank=0, **kwargs):
    probe = Probe(role, rank, endpoint="http://127.0.0.1:9", cuda_available=False, **kwargs)
    sent = Sent()
    probe._link.send = sent.send
    return probe, sent


def steps(probe, n, has_work=True, body=lambda: None):
    for _ in range(n):
        probe.step_begin(has_work)
        body()
        probe.step_end(has_work)


def test_identity_and_hello_come_from_the_profile():
    scheduler = Role("scheduler", "scheduler", step_driven=True)
    toy = EngineProfile(name="toy", roles=(scheduler,), version=lambda: "toy 1.0")
    probe = Probe("scheduler", 0, profile=toy, endpoint="http://127.0.0.1:9", cuda_available=False)
    ident = probe.identity
    assert (ident.role, ident.role_label, ident.step_driven, ident.rank, ident.engine) == (
        "scheduler", "scheduler", True, 0, "toy 1.0")
    assert Probe("api_server", None, endpoint="http://127.0.0.1:9", cuda_available=False).identity.step_driven is False
    with pytest.raises(ValueError, match="no role 'worker'"):
        Probe("worker", 0, profile=toy, endpoint="http://127.0.0.1:9", cuda_available=False)
    with pytest.raises(ValueError, match="rank"):  # the sidecar would refuse this hello forever
        Probe("worker", -1, profile=GENERIC, endpoint="http://127.0.0.1:9", cuda_available=False)


def test_arm_answers_armed_with_the_step_count_and_begin_starts_at_the_common_step(tmp_path):
    probe, sent = make_probe()
    steps(probe, 3)
    probe._on_message(Arm(spec=CaptureSpec(id="c1", steps=2)))
    # With its own step rate lately (its flight recorder's rows): the sidecar's lead needs one.
    [armed] = sent
    assert armed.step_rate > 0
    assert armed == CaptureReport(job_id="c1", state="armed", steps_seen=3, step_rate=armed.step_rate)
    steps(probe, 2)  # armed, not begun: nothing is recorded
    assert probe._capture.state == "armed"
    probe._on_message(Begin(job_id="other", start_step=0))  # not this probe's job: ignored
    assert probe._capture.start_step is None
    probe._on_message(Begin(job_id="c1", start_step=6))
    steps(probe, 1)  # step 5
    assert probe._capture.state == "armed"
    steps(probe, 2)  # steps 6 and 7
    assert probe._capture is None
    reports = sent.of(CaptureReport)
    assert [r.state for r in reports][:3] == ["armed", "capturing", "exporting"]
    assert (reports[-1].first_step, reports[-1].steps_recorded) == (6, 2)


def test_stop_goes_to_the_job_with_that_id(tmp_path):
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="c2", steps=5)))
    probe._on_message(SyncArm(spec=SyncSpec(id="s2", steps=5)))
    assert [(type(m), m.state, m.steps_seen) for m in sent] == [(CaptureReport, "armed", 0), (SyncReport, "armed", 0)]
    probe._on_message(Stop(job_id="s2", reason="stopped by request"))
    assert probe._scan.finished and not probe._capture.finished
    assert sent[-1] == SyncReport(job_id="s2", state="failed", stop_reason="stopped by request",
                                  error="no step scanned before the scan ended (stopped by request)")
    probe._on_message(Stop(job_id="c2", reason="timeout"))
    assert probe._capture.finished
    assert (sent[-1].job_id, sent[-1].state, sent[-1].stop_reason) == ("c2", "failed", "timeout")


def test_a_second_job_of_a_kind_is_refused_while_one_runs(tmp_path):
    probe, sent = make_probe()
    probe._on_message(Arm(spec=CaptureSpec(id="c3", steps=1)))
    probe._on_message(Arm(spec=CaptureSpec(id="c4", steps=1)))
    probe._on_message(SyncArm(spec=SyncSpec(id="s3", steps=1)))
    probe._on_message(SyncArm(spec=SyncSpec(id="s4", steps=1)))
    assert [(m.job_id, m.state, m.error) for m in sent] == [
        ("c3", "armed", None), ("c4", "failed", "capture c3 still running here"),
        ("s3", "armed", None), ("s4", "failed", "scan s3 still running here"),
    ]


def test_a_process_without_steps_or_loop_refuses_a_capture(tmp_path):
    probe, sent = make_probe("api_server", None)
    probe._on_message(Arm(spec=CaptureSpec(id="c5", steps=1)))
    assert sent == [CaptureReport(job_id="c5", state="failed", error="no event loop known in this process yet")]


def test_heartbeats_are_typed():
    probe, _ = make_probe()
    steps(probe, 4)
    beat = probe._heartbeats.build()
    assert beat == Heartbeat(steps=4) and decode_from_probe(encode(beat)) == beat


# -- a scan armed through the probe, with the engine's own rules ------------------------------------
X = torch.randn(4)


def toy_forward():
    return X.sum().item()  # a hidden sync, in the toy engine's forward phase


def toy_sample():
    return X.tolist()  # the toy engine's deliberate transfer


TOY = EngineProfile(
    name="toy",
    roles=(Role("scheduler", "scheduler", step_driven=True),),
    phase_rules=(PhaseRule(FORWARD, "/tests/probe/", frozenset({"toy_forward"})),),
    allow_entries=(AllowEntry("*test_probe_messages.py", "toy_sample", reason="the toy engine's sampled tokens"),),
)


def test_a_scan_uses_the_profiles_phase_rules_and_allowlist_and_waits_for_begin(monkeypatch):
    monkeypatch.setenv("SIDECAR_SYNC_TREAT_CPU_AS_DEVICE", "1")
    probe, sent = make_probe("scheduler", None, profile=TOY)
    body = lambda: (toy_forward(), toy_sample())  # noqa: E731
    steps(probe, 2, body=body)
    probe._on_message(SyncArm(spec=SyncSpec(id="s5", steps=2)))
    assert sent == [SyncReport(job_id="s5", state="armed", steps_seen=2, step_rate=sent[0].step_rate,
                               treat_cpu_as_device=True)] and sent[0].step_rate > 0
    steps(probe, 1, body=body)  # armed, not begun: not scanned
    probe._on_message(Begin(job_id="s5", start_step=4))
    steps(probe, 1, has_work=False, body=body)  # idle: neither scanned nor counted
    steps(probe, 4, body=body)  # step 3 not scanned; 4 and 5 scanned
    assert probe._scan is None
    done = sent[-1]
    assert (done.state, done.first_step, done.steps_recorded, done.treat_cpu_as_device) == ("done", 4, 2, True)
    sites = {(s["function"], s["op"]): s for s in done.sites}
    assert set(sites) == {("toy_forward", "item"), ("toy_sample", "tolist")}
    hidden, expected = sites["toy_forward", "item"], sites["toy_sample", "tolist"]
    assert (hidden["phase"], hidden["classification"], hidden["count"]) == ("forward", "hidden", 2)
    assert (expected["phase"], expected["classification"], expected["reason"]) == (
        "other", "expected", "the toy engine's sampled tokens")


def test_the_generic_profile_has_no_phases_nor_expected_sites(monkeypatch):
    monkeypatch.setenv("SIDECAR_SYNC_TREAT_CPU_AS_DEVICE", "1")
    probe, sent = make_probe()
    probe._on_message(SyncArm(spec=SyncSpec(id="s6", steps=1)))
    probe._on_message(Begin(job_id="s6", start_step=0))
    steps(probe, 1, body=lambda: (toy_forward(), toy_sample()))
    assert {(s["function"], s["phase"], s["classification"]) for s in sent[-1].sites} == {
        ("toy_forward", "other", "hidden"), ("toy_sample", "other", "hidden")}


# -- the API server's window capture --------------------------------------------------------------
def test_the_window_capture_starts_on_arm_and_stops_on_stop_on_the_event_loop(tmp_path):
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    told, done = [], threading.Event()

    def on_capture_report(msg):
        told.append((msg, threading.get_ident()))
        if msg.state in ("done", "failed"):
            done.set()

    try:
        probe, sent = make_probe("api_server", None, loop=loop, on_capture_report=on_capture_report)
        probe._on_message(Arm(spec=CaptureSpec(id="w1", steps=3)))
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), loop).result(5)  # the start has run
        assert probe._capture.state == "recording"
        asyncio.run_coroutine_threadsafe(asyncio.to_thread(lambda: torch.randn(8, 8).sum()), loop).result(5)
        probe._on_message(Stop(job_id="w1", reason="steps recorded"))
        assert done.wait(20)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
    assert [m.state for m, _ in told] == ["capturing", "exporting", "done"]
    assert [m for m, _ in told] == sent  # the sidecar is told the same reports
    assert all(isinstance(m, CaptureReport) for m, _ in told)
    # capturing and exporting are reported where torch.profiler starts and stops: the loop's thread
    assert {thread for _, thread in told[:2]} == {loop_thread.ident}
    # Named <role>-pid<pid>-<host>-p<probe id> (unique on a shared volume: docs/api.md).
    assert told[-1][0].file.endswith("api_server-pid%d-%s-p%s.json" % (
        probe.identity.pid, file_name_part(probe.identity.host), probe.identity.probe_id)) and told[-1][0].bytes > 0
