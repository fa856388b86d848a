"""``sidecar serve`` keeps what it writes to its own user (issue 27, item 5): the trace dir it creates
is 0700 and every file it writes there 0600, whatever the umask it was started with; an existing trace
dir that others can read is left as it is (it may be a volume shared on purpose) with a warning."""

from __future__ import annotations

import json
import os
import stat
import urllib.request

import pytest

from served import Served, serve_env
from sidecar.probe import Probe


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def umask_of(pid: int) -> int | None:
    """A process's umask, from /proc (Linux 4.7 and later); None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return None


@pytest.fixture
def permissive_umask():
    """The sidecar is started with umask 022, the usual one, which leaves files readable by all."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_trace_dir_and_the_files_written_in_it_are_private(tmp_path, monkeypatch, permissive_umask):
    trace_dir = tmp_path / "new" / "traces"
    env = serve_env(tmp_path)
    served = Served("--port", "0", "--trace-dir", str(trace_dir), env=env)
    probe = None
    try:
        urls = served.wait()
        assert urls, served.stderr
        url = urls[0]
        assert mode(trace_dir) == 0o700, oct(mode(trace_dir))
        assert mode(tmp_path / "token") == 0o600
        if umask_of(served.proc.pid) is not None:
            assert umask_of(served.proc.pid) == 0o077
        # A file the sidecar writes in the trace dir: a capture's capture.json, saved as the capture starts.
        monkeypatch.delenv("SIDECAR_TOKEN", raising=False)
        monkeypatch.setenv("SIDECAR_TOKEN_FILE", str(tmp_path / "token"))
        probe = Probe("worker", 0, endpoint=url, cuda_available=False).start()
        assert probe.connected.wait(30), "the probe did not connect"
        request = urllib.request.Request(f"{url}/profile/start?steps=1&timeout_s=600", method="POST")
        with urllib.request.urlopen(request, timeout=30) as resp:
            capture_id = json.loads(resp.read())["id"]
        folder = trace_dir / "captures" / capture_id
        assert mode(folder) == 0o700, oct(mode(folder))
        assert mode(folder / "capture.json") == 0o600, oct(mode(folder / "capture.json"))
    finally:
        if probe is not None:
            probe.close()
        served.stop()


def test_an_existing_trace_dir_others_can_read_is_kept_with_a_warning(tmp_path, permissive_umask):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    served = Served("--port", "0", "--trace-dir", str(shared), env=serve_env(tmp_path))
    try:
        assert served.wait(), served.stderr
        assert mode(shared) == 0o755, "an existing trace dir's mode is the user's to change"
        warning = " ".join("".join(served.lines[:-1]).split())
        assert str(shared) in warning and "0755" in warning and "chmod 700" in warning, served.stderr
    finally:
        served.stop()
