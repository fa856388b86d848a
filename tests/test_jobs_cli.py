"""``sidecar capture``, ``sync``, ``status``, ``list``, ``stop`` as a user runs them, against a real sidecar
process and stand-in engines (tests/fake_engine.py): tables by default, JSON on request, one line on
stderr and a non-zero exit on any error."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.devtools.stack import Stack
from sidecar.cli.jobs import Progress, progress_line

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
PLANTED_LINE = next(n for n, line in enumerate(FAKE_ENGINE.read_text().splitlines(), 1) if "# PLANTED_LINE" in line)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    """A sidecar process with an engine core and a worker whose step has an .item() (CPU taken for a device)."""
    work = tmp_path_factory.mktemp("jobs-cli")
    stack = Stack(model_dir=work, work_dir=work, env={"SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1"})
    stack.start_sidecar()
    engines = [subprocess.Popen([sys.executable, str(FAKE_ENGINE), role, *args], env=stack._env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for role, args in (("engine_core", ()), ("worker", ("--rank", "0", "--planted-sync")))]
    try:
        stack.wait_for_processes(2, timeout=60)
        yield stack
    finally:
        for proc in engines:
            proc.kill()
            proc.wait()
        stack.stop_sidecar()


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args, "--url", stack.sidecar_url],
                          capture_output=True, text=True, timeout=180, env=stack._env())


def test_capture_sync_status_list_and_stop(sidecar):
    done = cli(sidecar, "capture", "--steps", "3", "--record-shapes", "--profile-memory", "--with-flops", "--json")
    assert done.returncode == 0, done.stderr
    capture = json.loads(done.stdout)
    assert capture["state"] == "done" and capture["steps"] == 3
    assert done.stderr == "", "no progress when stderr is not a terminal"

    scan = cli(sidecar, "sync", "--steps", "3")
    assert scan.returncode == 0, scan.stderr
    header, *rows = scan.stdout.splitlines()
    assert "done" in header and "1 hidden" in header
    assert any(row.startswith("hidden") and f"fake_engine.py:{PLANTED_LINE}" in row and " item " in row for row in rows), rows

    status = cli(sidecar, "status")
    assert status.returncode == 0, status.stderr
    assert "2 engine processes" in status.stdout and "running: nothing" in status.stdout
    assert capture["id"] in status.stdout and "engine core (pid" in status.stdout
    one = cli(sidecar, "status", capture["id"], "--json")
    assert json.loads(one.stdout)["id"] == capture["id"]

    listed = cli(sidecar, "list")
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].startswith(capture["id"])
    scans = json.loads(cli(sidecar, "list", "--scans", "--json").stdout)["scans"]
    assert scans[0]["hidden"] == 1

    report = cli(sidecar, "summary", capture["id"])
    assert report.returncode == 0 and report.stdout.startswith("Trace: ") and "Summary: CPU only" in report.stdout
    assert json.loads(cli(sidecar, "summary", capture["id"], "--json").stdout)["schema_version"] == 1
    out = Path(sidecar.work_dir) / "trace.json.gz"
    got = cli(sidecar, "download", capture["id"], "-o", str(out))
    assert got.returncode == 0, got.stderr
    assert any(e.get("name", "").startswith("ProfilerStep#") for e in json.loads(gzip.decompress(out.read_bytes()))["traceEvents"])
    watch = cli(sidecar, "watch")
    assert watch.returncode == 0 and "no engine process reports a sync watch" in watch.stdout
    metrics = cli(sidecar, "metrics", "--grep", "sidecar_captures_total")
    assert metrics.returncode == 0 and 'state="done"' in metrics.stdout

    nothing = cli(sidecar, "stop")
    assert nothing.returncode == 2 and nothing.stdout == ""
    assert nothing.stderr.startswith("sidecar stop: HTTP 409") and "Traceback" not in nothing.stderr


def test_errors_are_one_line_and_exit_2(sidecar, tmp_path):
    bad = cli(sidecar, "capture", "--steps", "0")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "steps" in bad.stderr
    unknown = cli(sidecar, "status", "20990101-000000-abcdef")
    assert unknown.returncode == 2 and "404" in unknown.stderr
    away = subprocess.run([sys.executable, "-m", "sidecar.cli", "list", "--url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, timeout=60)
    assert away.returncode == 2 and "cannot reach the sidecar at http://127.0.0.1:9" in away.stderr
    token = cli(sidecar, "list", "--token-file", str(tmp_path / "missing"))
    assert token.returncode == 2 and "cannot read the token file" in token.stderr


def test_progress_is_one_rewritten_line_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    status = {"id": "20261123-000000-abcdef", "state": "capturing", "steps": 5, "processes": [
        {"label": "worker rank 0 (pid 2)", "role": "worker", "state": "capturing", "steps_recorded": 3},
        {"label": "API server (pid 1)", "role": "api_server", "state": "capturing", "steps_recorded": 0}]}
    assert progress_line(status, 1.25) == ("capture 20261123-000000-abcdef: capturing (1.2 s) · "
                                           "worker rank 0 (pid 2) capturing 3/5 · API server (pid 1) capturing")
    term = Terminal()
    progress = Progress(term)
    progress(status)
    progress(status)  # unchanged: not written again
    progress.close()
    assert term.getvalue().count("capture 20261123") == 1 and term.getvalue().endswith("\r\033[K")
    piped = io.StringIO()
    quiet = Progress(piped)
    quiet(status)
    quiet.close()
    assert piped.getvalue() == ""
