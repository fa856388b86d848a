"""``sidecar serve --allowed-host NAME`` (issue 27, item 5): host names a browser may use to reach the
sidecar besides loopback names and IP addresses. Each value is checked at start (exit 2 naming it),
lower-cased, and handed to the service as ``ServiceSettings.allowed_hosts``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from served import serve_env
from sidecar.cli import build_parser
from sidecar.service.routes.keys import SETTINGS


def parse(*args: str):
    return build_parser("serve").parse_args(["serve", *args])


def test_good_names_are_lower_cased_and_kept_in_order():
    args = parse("--allowed-host", "Sidecar", "--allowed-host", "sidecar.monitoring.svc.cluster.local",
                 "--allowed-host", "PROFILER.example.COM", "--allowed-host", "sidecar",
                 "--allowed-host", "my_host-1.internal")
    assert args.allowed_host == ["sidecar", "sidecar.monitoring.svc.cluster.local", "profiler.example.com",
                                 "sidecar", "my_host-1.internal"]
    assert parse().allowed_host == []


@pytest.mark.parametrize("value, says", [
    ("", "empty"),
    ("   ", "empty"),
    ("side car", "space"),
    ("sidecar\t", "space"),
    ("http://sidecar", "scheme"),
    ("sidecar/path", "path"),
    ("sidecar:8787", "port"),
    ("10.0.0.7", "IP address"),
    ("[::1]", "IP address"),
    ("*.example.com", "not a host name"),
    ("a..b", "not a host name"),
    ("sidecar.", "not a host name"),
    ("-sidecar", "not a host name"),
    ("a" * 64 + ".example", "not a host name"),
    ("sidécar", "punycode"),
])
def test_bad_values_exit_2_naming_the_value(value, says, capsys):
    with pytest.raises(SystemExit) as stopped:
        parse(f"--allowed-host={value}")
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "--allowed-host" in err and repr(value) in err and says in err, err


def test_the_command_exits_2_on_a_bad_value(tmp_path):
    result = subprocess.run([sys.executable, "-m", "sidecar.cli", "serve", "--port", "0", "--trace-dir",
                             str(tmp_path / "traces"), "--allowed-host", "https://sidecar.example/"],
                            capture_output=True, text=True, timeout=120, env=serve_env(tmp_path))
    assert result.returncode == 2 and "'https://sidecar.example/'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def umask_kept():
    """``sidecar serve`` sets its process's umask; run in this process, it must not stay."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def test_the_names_reach_the_service_settings(tmp_path, monkeypatch, umask_kept):
    from sidecar.service import serving

    served = {}
    monkeypatch.setattr(serving, "serve", lambda app, *args, **kwargs: served.update(app=app))
    monkeypatch.delenv("SIDECAR_TOKEN", raising=False)
    monkeypatch.setenv("SIDECAR_TOKEN_FILE", str(tmp_path / "token"))
    args = parse("--port", "0", "--trace-dir", str(tmp_path / "traces"),
                 "--allowed-host", "Sidecar.Example", "--allowed-host", "sidecar")
    assert args.handler(args) == 0
    assert served["app"][SETTINGS].allowed_hosts == ("sidecar.example", "sidecar")
