"""``sidecar analyze`` as a user runs it: exit codes, stdout, stderr, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sidecar.analysis import analyze_path

from . import synth
from .conftest import trace_path

REPO = Path(__file__).resolve().parents[2]


def _analyze(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "analyze", *args], capture_output=True, text=True, env=env, timeout=120)


def test_report():
    done = _analyze(str(trace_path("a100-cuda-event-sync.json.gz")))
    assert done.returncode == 0, done.stderr
    assert "Summary: GPU busy" in done.stdout
    assert "Top kernels:" in done.stdout
    assert "cudaStreamSynchronize (sync): 1×" in done.stdout
    assert "aten::_local_scalar_dense" in done.stdout
    assert done.stderr == ""


def test_syncs_names_each_site_as_a_scan_does():
    path = str(trace_path("a100-cuda-event-sync.json.gz"))
    done = _analyze(path, "--syncs")
    assert done.returncode == 0, done.stderr
    # 3, not 4: the trace's last call, torch.profiler's own synchronize at stop, is not a site.
    table = done.stdout.split("Sync sites (3; hidden first):")[1].splitlines()
    assert not any("cudaDeviceSynchronize" in row for row in table), table
    assert any("bool / cudaStreamSynchronize" in row and "aten::_local_scalar_dense" in row and " hidden " in row
               for row in table), table
    scan = json.loads(_analyze(path, "--syncs", "--json").stdout)["sync_scan"]
    assert {(s["op"], s["api"]) for s in scan["sites"]} >= {("bool", "cudaMemcpyAsync"), ("event.synchronize", "cudaEventSynchronize")}
    assert "sync_scan" not in json.loads(_analyze(path, "--json").stdout), "only when asked: it reads the trace again"


def test_json_with_top():
    done = _analyze(str(trace_path("v100-train-large.json.gz")), "--json", "--top", "3")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["schema_version"] == 1
    assert len(summary["gpu"]["top_kernels"]) == 3
    assert summary["gpu"]["kernel_count"] == 19370
    assert [s["step"] for s in summary["steps"]] == [2, 3, 4, 5, 6]
    # The command reads this large file in two processes (halves.py); this one reads it in one go.
    in_one_go = analyze_path(trace_path("v100-train-large.json.gz"), top_n=3)
    assert summary == json.loads(json.dumps(in_one_go))


def test_folder(tmp_path):
    synth.write(tmp_path / "rank0.json", [synth.kernel("k", 0, 5, 1)], distributedInfo={"rank": 0})
    synth.write(tmp_path / "rank1.json.gz", [synth.kernel("k", 0, 7, 1)], distributedInfo={"rank": 1})
    done = _analyze(str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpu"]["kernel_time_us"] == 12


def test_corrupt_file_exit_2_without_traceback(tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    done = _analyze(str(path))
    assert done.returncode == 2
    assert done.stderr.startswith(f"sidecar analyze: {path}: ")
    assert "gzip" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_truncated_file(tmp_path):
    path = tmp_path / "cut.json"
    path.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1')
    done = _analyze(str(path), "--json")
    assert done.returncode == 2
    assert "truncated" in done.stderr and "Traceback" not in done.stderr


def test_missing_file(tmp_path):
    done = _analyze(str(tmp_path / "nothing.json"))
    assert done.returncode == 2
    assert "no such file or folder" in done.stderr and "Traceback" not in done.stderr


def test_bad_top_is_a_usage_error():
    done = _analyze("x.json", "--top", "0")
    assert done.returncode == 2
    assert "must be at least 1" in done.stderr
