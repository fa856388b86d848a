"""``sidecar capture --nsys`` as a user runs it, against a real sidecar process and stand-in engines: the
worker's CUDA profiler and NVTX calls recorded to a file (tests/fake_engine.py ``--nsys-log``); the answer
says where nsys writes its report; a torch.profiler option beside it is one line on stderr and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nsys_calls import balanced, read_log
from sidecar.devtools.stack import Stack

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    work = tmp_path_factory.mktemp("nsys-cli")
    stack = Stack(model_dir=work, work_dir=work, env={})
    stack.start_sidecar()
    log = work / "worker.calls"
    engines = [subprocess.Popen([sys.executable, str(FAKE_ENGINE), role, *args], env=stack._env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for role, args in (("engine_core", ()),
                                  ("worker", ("--rank", "0", "--phases", "--nsys-log", str(log))))]
    try:
        stack.wait_for_processes(2, timeout=60)
        yield stack, log
    finally:
        for proc in engines:
            proc.kill()
            proc.wait()
        stack.stop_sidecar()


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "sidecar.cli", *args, "--url", stack.sidecar_url],
                          capture_output=True, text=True, timeout=180, env=stack._env())


def test_capture_nsys_marks_the_steps_and_says_where_the_report_is(sidecar):
    stack, log = sidecar
    done = cli(stack, "capture", "--steps", "3", "--nsys")
    assert done.returncode == 0, done.stderr
    assert "done" in done.stdout.splitlines()[0] and "nsys report: written by nsys where its -o said" in done.stdout
    calls = read_log(log)
    assert calls[0] == ("start",) and calls[-1] == ("stop",) and balanced(calls)
    assert sum(1 for c in calls if c[0] == "push" and c[1].startswith("step ")) == 3

    as_json = json.loads(cli(stack, "status", done.stdout.split()[1].rstrip(":"), "--json").stdout)
    assert as_json["backend"] == "nsys" and as_json["trace"] is None


def test_a_torch_profiler_option_beside_nsys_is_one_line_and_exit_2(sidecar):
    stack, _ = sidecar
    bad = cli(stack, "capture", "--steps", "3", "--nsys", "--record-shapes")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "record_shapes" in bad.stderr and "backend=nsys" in bad.stderr
