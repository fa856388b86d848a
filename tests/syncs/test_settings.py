"""The sync detector's environment variables: booleans through the one parser (sidecar.common.config)."""

from __future__ import annotations

import logging

import pytest

from sidecar.syncs import settings


@pytest.mark.parametrize("read, name", [(settings.treat_cpu_as_device, settings.ENV_TREAT_CPU_AS_DEVICE),
                                        (settings.watch_enabled, settings.ENV_WATCH)])
def test_boolean_variables(read, name, monkeypatch, caplog):
    monkeypatch.delenv(name, raising=False)
    assert read() is False
    for on in ("1", "true", "YES", " on "):
        monkeypatch.setenv(name, on)
        assert read() is True
    for off in ("0", "false", "no", "off", ""):
        monkeypatch.setenv(name, off)
        assert read() is False
    monkeypatch.setenv(name, "maybe")
    with caplog.at_level(logging.ERROR):
        assert read() is False  # the default
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(name in m and "maybe" in m for m in errors), errors
