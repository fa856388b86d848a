"""The detector on plain torch: every kind of sync at its file:line, nothing for code without syncs,
nothing from other threads, nothing left patched afterwards."""

from __future__ import annotations

import threading
import time

import pytest
import torch

import sync_kinds
from sidecar.syncs import ENV_TREAT_CPU_AS_DEVICE, PhaseRule, SiteLocator, SyncDetector


@pytest.fixture
def fake_cuda_syncs(monkeypatch):
    """No-op stand-ins for CUDA's synchronize calls (they raise without CUDA). The detector wraps
    whatever is there when it arms, so these exercise the same wrapper a GPU host uses."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda.Event, "synchronize", lambda self: None)
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", lambda self: None)


def scan(fn, *args, treat=True, steps=1, **detector_kwargs):
    detector = SyncDetector(treat_cpu_as_device=treat, **detector_kwargs)
    detector.arm()
    try:
        for step in range(steps):
            detector.step_begin(step)
            try:
                fn(*args)
            finally:
                detector.step_end()
    finally:
        detector.disarm()
    return detector.stats()


@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference_mode"])
@pytest.mark.parametrize("name", sorted(sync_kinds.KINDS))
def test_each_kind_is_found_at_its_line(name, inference, fake_cuda_syncs):
    line, op = sync_kinds.KINDS[name]
    fn = getattr(sync_kinds, name)

    def run():
        with torch.inference_mode(inference):
            fn(sync_kinds._x())

    stats = scan(run)
    assert [(s.site.file, s.site.line, s.site.function, s.op) for s in stats] == [(sync_kinds.FILE, line, name, op)]
    assert stats[0].count == 1 and stats[0].blocked_ns > 0
    assert stats[0].site.path == "sync_kinds.py"


@pytest.mark.parametrize("inference", [False, True], ids=["grad", "inference_mode"])
def test_code_without_syncs_yields_no_sites(inference):
    def run():
        with torch.inference_mode(inference):
            sync_kinds.no_sync(sync_kinds._x())

    assert scan(run) == []


def test_cpu_tensors_are_not_device_tensors_by_default():
    kinds = [getattr(sync_kinds, n) for n in sync_kinds.KINDS if n not in sync_kinds.CUDA_ONLY and "synchronize" not in n]
    assert scan(lambda: [k(sync_kinds._x()) for k in kinds], treat=False) == []


def test_setting_comes_from_the_environment(monkeypatch, caplog):
    monkeypatch.setenv(ENV_TREAT_CPU_AS_DEVICE, "1")
    assert SyncDetector().treat_cpu_as_device is True
    assert SyncDetector(treat_cpu_as_device=False).treat_cpu_as_device is False
    monkeypatch.setenv(ENV_TREAT_CPU_AS_DEVICE, "maybe")
    assert SyncDetector().treat_cpu_as_device is False
    assert ENV_TREAT_CPU_AS_DEVICE in caplog.text
    monkeypatch.delenv(ENV_TREAT_CPU_AS_DEVICE)
    assert SyncDetector().treat_cpu_as_device is False


def test_counts_steps_and_blocked_time(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: time.sleep(0.02))
    x = sync_kinds._x()
    detector = SyncDetector(treat_cpu_as_device=True)
    detector.arm()
    for step in range(4):
        detector.step_begin(step)
        if step in (1, 2):
            sync_kinds.cuda_synchronize(x)
            sync_kinds.item(x)
            sync_kinds.item(x)
        detector.step_end()
        sync_kinds.item(x)  # between steps: not scanned
    detector.disarm()
    by_op = {s.op: s for s in detector.stats()}
    assert set(by_op) == {"synchronize", "item"}
    assert (by_op["item"].count, by_op["item"].first_step, by_op["item"].last_step) == (4, 1, 2)
    assert by_op["synchronize"].count == 2
    assert by_op["synchronize"].blocked_ns >= 2 * 20e6


def test_other_threads_are_not_watched():
    x = sync_kinds._x()
    ready, done = threading.Event(), threading.Event()
    caught_elsewhere = []

    def other():
        ready.wait(5)
        for _ in range(50):
            sync_kinds.item(x)
            sync_kinds.tolist(x)
            sync_kinds.nonzero(x)
        caught_elsewhere.append(True)
        done.set()

    thread = threading.Thread(target=other)
    thread.start()

    def step():
        ready.set()
        assert done.wait(5)
        sync_kinds.unique(x)

    stats = scan(step)
    thread.join()
    assert caught_elsewhere == [True]
    assert [(s.op, s.site.function) for s in stats] == [("unique", "unique")]


def test_patches_are_removed_when_disarmed(fake_cuda_syncs):
    before = dict(torch.Tensor.__dict__)
    stream_sync = torch.cuda.Stream.synchronize
    detector = SyncDetector(treat_cpu_as_device=True)
    detector.arm()
    assert torch.cuda.Stream.synchronize is not stream_sync
    assert "tolist" in torch.Tensor.__dict__
    detector.disarm()
    assert torch.cuda.Stream.synchronize is stream_sync
    assert dict(torch.Tensor.__dict__).keys() == before.keys()
    assert scan(lambda: None) == []
    # Arm, disarm, arm again: still works.
    assert [s.op for s in scan(sync_kinds.tolist, sync_kinds._x())] == ["tolist"]


def test_overlapping_detectors_on_two_threads():
    x = sync_kinds._x()
    first = SyncDetector(treat_cpu_as_device=True)
    first.arm()
    second_stats = []

    def other():
        second_stats.extend(scan(sync_kinds.tolist, x))

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    first.step_begin(0)
    sync_kinds.item(x)
    first.step_end()
    first.disarm()
    assert [s.op for s in second_stats] == ["tolist"]
    assert [s.op for s in first.stats()] == ["item"]
    assert "tolist" not in torch.Tensor.__dict__ and "item" not in torch.Tensor.__dict__


def test_frames_in_skipped_directories_are_passed_over():
    import os

    # A skip entry is a path prefix: here, torch's folder and the one file sync_kinds.py.
    locator = SiteLocator(skip_dirs=(os.path.dirname(torch.__file__) + os.sep, sync_kinds.FILE))
    stats = scan(lambda: sync_kinds.item(sync_kinds._x()), locator=locator)
    assert [s.site.file for s in stats] == [__file__]  # the lambda in this test file


def test_phase_comes_from_the_rule_table():
    rules = (PhaseRule("sampling", functions=frozenset({"sample_like"})), PhaseRule("forward", path_part="/syncs/"))

    def sample_like():
        sync_kinds.item(sync_kinds._x())

    locator = SiteLocator(phase_rules=rules)
    assert [s.site.phase for s in scan(sample_like, locator=locator)] == ["forward"]  # innermost match
    locator = SiteLocator(phase_rules=rules[:1])
    assert [s.site.phase for s in scan(sample_like, locator=locator)] == ["sampling"]
    assert [s.site.phase for s in scan(sample_like, locator=SiteLocator(phase_rules=()))] == ["other"]


def test_bad_calls_still_raise_their_own_errors_and_are_not_counted():
    x = sync_kinds._x()

    def step():
        with pytest.raises(TypeError):
            x.to(object())
        with pytest.raises(RuntimeError):
            torch.zeros(3).copy_(torch.zeros(4))

    assert scan(step) == []
