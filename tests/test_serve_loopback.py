"""A loopback sidecar listens on 127.0.0.1 and on ::1 (issue 27, item 5). ``localhost`` may resolve to
::1 first: a process of another user listening on [::1] at the sidecar's port would otherwise get
every client (and token) that says ``localhost``. ``sidecar serve`` takes both, or does not start when
::1 is taken; on a host without IPv6 it serves 127.0.0.1 alone and says so."""

from __future__ import annotations

import errno
import json
import socket
import urllib.request

import pytest
from aiohttp import web

from served import Served, serve_env


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not has_ipv6_loopback(), reason="this host has no IPv6 loopback")


def health(url: str) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url + "/healthz", timeout=10) as resp:
        return json.loads(resp.read())


@needs_ipv6
def test_a_squatter_on_ipv6_loopback_stops_the_start(tmp_path):
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as squatter:
        squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        squatter.bind(("::1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        served = Served("--port", str(port), "--trace-dir", str(tmp_path / "traces"), env=serve_env(tmp_path))
        try:
            urls = served.wait()
            assert urls is None, f"the sidecar started beside a squatter on [::1]:{port}: {urls}"
            assert served.proc.returncode == 2, served.stderr
            assert f"[::1]:{port}" in served.stderr and "Traceback" not in served.stderr, served.stderr
        finally:
            served.stop()


@needs_ipv6
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_both_loopback_addresses_answer_on_one_port(tmp_path, host):
    served = Served("--host", host, "--port", "0", "--trace-dir", str(tmp_path / "traces"), env=serve_env(tmp_path))
    try:
        urls = served.wait()
        assert urls and urls[0].startswith("http://127.0.0.1:"), served.stderr
        port = int(urls[0].rsplit(":", 1)[1])
        assert urls == [f"http://127.0.0.1:{port}", f"http://[::1]:{port}"]
        for url in urls:
            assert health(url)["status"] == "ok"
    finally:
        served.stop()


async def test_an_optional_address_this_host_lacks_is_left_out():
    """What a host without IPv6 does with ::1 (EADDRNOTAVAIL), shown with an address no host has."""
    from sidecar.service.serving import BindError, JsonErrorsRunner, bind

    runner = JsonErrorsRunner(web.Application())
    await runner.setup()
    try:
        missing = "2001:db8::1"  # documentation prefix (RFC 3849): never configured on a host
        bound, left_out = await bind(runner, ["127.0.0.1", missing], 0, optional=[missing])
        assert [a[0] for a in bound] == ["127.0.0.1"]
        assert [(host, e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)) for host, e in left_out] == [(missing, True)]
        listening = list(runner.addresses)
        with pytest.raises(BindError) as refused:  # not optional: the start fails, naming it
            await bind(runner, ["127.0.0.1", missing], 0)
        assert refused.value.host == missing and "[2001:db8::1]" in str(refused.value)
        assert runner.addresses == listening, "a failed start left an address listening"
    finally:
        await runner.cleanup()


def test_the_start_says_when_it_serves_127_0_0_1_alone(capsys):
    from pathlib import Path

    from sidecar.cli.serve import _listening

    lacking = OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    _listening(Path("traces"))([("127.0.0.1", 8787)], [("::1", lacking)])
    first, announce = capsys.readouterr().err.splitlines()
    assert "no ::1" in first and "127.0.0.1 alone" in first and "listening on" not in first
    assert announce == "sidecar: listening on http://127.0.0.1:8787  traces in traces"
