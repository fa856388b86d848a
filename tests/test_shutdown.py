"""Issue #10, defect 10: ``sidecar serve`` exits within seconds of SIGTERM with probes connected.

aiohttp waits for every open handler before it exits (60 s by default), and a probe's websocket
handler lasts as long as its connection: the sidecar used to wait 9-17 s for the probes' own
heartbeat timeouts. Here one real probe is connected and a second connection never gets past its
handshake and never answers anything (a stuck engine process), the worst case for a close.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from sidecar.devtools.stack import free_port
from sidecar.probe import Probe
from sidecar.common.protocol import PROBE_WS_PATH

EXIT_BOUND_S = 5.0  # a correctness bound, not a benchmark: about 0.2 s measured, 9-17 s before the fix

UPGRADE = ("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.05)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False


def silent_websocket(port: int) -> socket.socket:
    """A websocket that says nothing after the upgrade, and never reads the sidecar's close."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(UPGRADE.format(path=PROBE_WS_PATH).encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 101"), "the probe channel did not upgrade"
    return sock


def test_sidecar_exits_soon_after_sigterm_with_probes_connected(tmp_path, monkeypatch):
    token_file = tmp_path / "token"  # written by the sidecar, read by the probe (as beside an engine)
    monkeypatch.delenv("SIDECAR_TOKEN", raising=False)
    monkeypatch.setenv("SIDECAR_TOKEN_FILE", str(token_file))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "sidecar.log", "wb")
    sidecar = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "serve", "--port", str(port),
                                "--trace-dir", str(tmp_path / "traces")],
                               env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    probe = silent = None
    try:
        wait_for(lambda: healthy(url) or sidecar.poll() is not None, 30, "the sidecar serves")
        assert sidecar.poll() is None, (tmp_path / "sidecar.log").read_text()
        probe = Probe("worker", 0, endpoint=url, cuda_available=False).start()
        assert probe.connected.wait(20), "the probe did not connect"
        silent = silent_websocket(port)
        time.sleep(0.3)  # the silent connection is in its handshake, waiting for a hello

        started = time.monotonic()
        sidecar.send_signal(signal.SIGTERM)
        code = sidecar.wait(timeout=60)
        took = time.monotonic() - started

        assert took < EXIT_BOUND_S, f"the sidecar took {took:.1f} s to exit after SIGTERM"
        assert code == 0, (tmp_path / "sidecar.log").read_text()
        # The probe was told (a close, not a heartbeat timeout) and is looking for the next sidecar.
        wait_for(lambda: not probe.connected.is_set(), 2, "the probe saw the sidecar go")
    finally:
        if sidecar.poll() is None:
            sidecar.kill()
            sidecar.wait()
        if silent is not None:
            silent.close()
        if probe is not None:
            probe.close()
        log.close()
