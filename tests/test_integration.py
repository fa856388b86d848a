"""sidecar.integration: what every engine plugin builds on. Class patches apply once and each on its
own; an engine object gets its probe and its telemetry once, a failure stored as None and logged."""

from __future__ import annotations

import logging

import pytest

from sidecar.engine import GENERIC, EngineProfile, Role
from sidecar.integration import attach, patching

PROFILE = EngineProfile(name="toy", roles=(Role("scheduler", "scheduler", step_driven=True),),
                        service_name="toy-engine", provider="toy")


def _step_class():
    class Engine:
        def step(self, n):
            return n + 1

    return Engine


def _counting(calls):
    def make(original):
        def step(self, n):
            calls.append(n)
            return original(self, n)

        return step

    return make


def test_a_patch_applies_once_and_keeps_the_original_name():
    calls = []
    cls = _step_class()
    patching.patch(cls, "step", _counting(calls))
    patching.patch(cls, "step", _counting(calls))  # a plugin loaded twice
    assert cls().step(1) == 2 and calls == [1]
    assert getattr(cls.step, patching.MARK) is True and cls.step.__name__ == "step"
    patching.patch(cls, "missing", _counting(calls))  # not defined on the class: left alone
    assert "missing" not in cls.__dict__


def test_one_failing_patch_never_stops_the_others(caplog, monkeypatch):
    import types

    module = types.ModuleType("toy_engine_module")
    module.Engine = _step_class()
    monkeypatch.setitem(__import__("sys").modules, "toy_engine_module", module)
    calls = []

    def broken(original):
        raise RuntimeError("wrapper factory failed")

    with caplog.at_level(logging.WARNING):
        patching.install([
            ("no_such_engine_module", "Engine", "step", _counting(calls)),
            ("toy_engine_module", "NoSuchClass", "step", _counting(calls)),
            ("toy_engine_module", "Engine", "step", broken),
            ("toy_engine_module", "Engine", "step", _counting(calls)),
        ])
    assert module.Engine().step(3) == 4 and calls == [3]
    assert caplog.text.count("inference-sidecar: cannot patch") == 3
    assert "no_such_engine_module.Engine.step" in caplog.text and "wrapper factory failed" in caplog.text


class _FakeProbe:
    made: list = []
    fail = False

    def __init__(self, role, rank=None, **kwargs):
        if _FakeProbe.fail:
            raise RuntimeError("no sidecar library here")
        self.role, self.rank, self.kwargs = role, rank, kwargs
        _FakeProbe.made.append(self)

    def start(self):
        return self


@pytest.fixture
def fake_probe(monkeypatch):
    _FakeProbe.made, _FakeProbe.fail = [], False
    monkeypatch.setattr(attach, "Probe", _FakeProbe)
    return _FakeProbe


def test_attach_probe_once_with_the_profile(fake_probe):
    class Obj:
        pass

    obj = Obj()
    loop = object()
    probe = attach.attach_probe(obj, PROFILE, "scheduler", 2, loop=loop)
    assert attach.attach_probe(obj, PROFILE, "scheduler", 2) is probe and fake_probe.made == [probe]
    assert obj.__dict__[attach.PROBE_ATTR] is probe
    assert (probe.role, probe.rank, probe.kwargs) == ("scheduler", 2, {"profile": PROFILE, "loop": loop})


def test_a_probe_that_fails_is_stored_as_none_logged_and_not_retried(fake_probe, caplog):
    class Obj:
        pass

    fake_probe.fail = True
    obj = Obj()
    with caplog.at_level(logging.WARNING):
        assert attach.attach_probe(obj, PROFILE, "scheduler") is None
    assert "probe not started in scheduler: no sidecar library here" in caplog.text
    fake_probe.fail = False
    assert attach.attach_probe(obj, PROFILE, "scheduler") is None and fake_probe.made == []
    assert obj.__dict__[attach.PROBE_ATTR] is None


def test_attach_probe_with_the_real_probe_class_for_a_role_of_the_profile():
    class Obj:
        pass

    obj = Obj()
    probe = attach.attach_probe(obj, PROFILE, "scheduler", 0, endpoint="http://127.0.0.1:9", cuda_available=False)
    try:
        assert probe is not None and probe.identity.label.startswith("scheduler rank 0 (pid ")
        assert probe.identity.step_driven and probe.identity.engine == "toy"
    finally:
        if probe is not None:
            probe.close()
    other = Obj()
    assert attach.attach_probe(other, PROFILE, "api_server", None) is None  # not a role of this engine


def test_attach_telemetry_once_named_by_the_profile(monkeypatch):
    monkeypatch.setenv("SIDECAR_METRICS_PUSH", "0")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)

    class Obj:
        pass

    monkeypatch.setenv("SIDECAR_TELEMETRY", "0")
    off = Obj()
    assert attach.attach_telemetry(off, PROFILE, "scheduler", 0, steps=True) is None
    assert off.__dict__[attach.TELEMETRY_ATTR] is None and off.__dict__[attach.STEPS_ATTR] is None

    monkeypatch.setenv("SIDECAR_TELEMETRY", "1")
    on = Obj()
    telemetry = attach.attach_telemetry(on, PROFILE, "scheduler", 0, steps=True)
    try:
        assert telemetry is not None and on.__dict__[attach.TELEMETRY_ATTR] is telemetry
        recorder = on.__dict__[attach.STEPS_ATTR]
        assert recorder is not None
        assert attach.attach_telemetry(on, PROFILE, "scheduler", 0, steps=True) is telemetry
        assert on.__dict__[attach.STEPS_ATTR] is recorder
        assert telemetry.resource.attributes["service.name"] == "toy-engine"
        assert telemetry.resource.attributes["sidecar.process.rank"] == 0
    finally:
        if telemetry is not None:
            telemetry.shutdown()

    no_steps = Obj()
    telemetry = attach.attach_telemetry(no_steps, GENERIC, "engine_core", None, steps=False)
    try:
        assert no_steps.__dict__[attach.STEPS_ATTR] is None
        assert telemetry.resource.attributes["service.name"] == GENERIC.service_name
    finally:
        telemetry.shutdown()


def test_telemetry_that_fails_to_start_is_stored_as_none_and_logged(monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("exporter exploded")

    monkeypatch.setattr(attach, "create_telemetry", broken)

    class Obj:
        pass

    obj = Obj()
    with caplog.at_level(logging.WARNING):
        assert attach.attach_telemetry(obj, PROFILE, "scheduler", steps=True) is None
    assert "telemetry not started in scheduler: exporter exploded" in caplog.text
    assert obj.__dict__[attach.TELEMETRY_ATTR] is None and obj.__dict__[attach.STEPS_ATTR] is None
