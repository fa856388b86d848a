"""``sidecar diff A B`` on files as a user runs it: exit codes, stdout, stderr, never a traceback.
(Capture ids, diffed through a running sidecar: tests/service/test_diff_routes.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from . import synth
from .conftest import trace_path

REPO = Path(__file__).resolve().parents[2]


def _diff(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    return subprocess.run([sys.executable, "-m", "sidecar.cli", "diff", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def _trace(path: Path, gemm_us: float, **top) -> Path:
    events = []
    for n in range(4):
        ts = n * 1000
        events += [synth.step(n + 1, ts, 1000 + 5 * (n % 2)), synth.runtime("cudaLaunchKernel", ts + 1, 2, n + 1),
                   synth.kernel("gemm", ts + 10, gemm_us, n + 1)]
    return synth.write(path, events, **top)


def test_text_names_the_change_and_json_has_every_section(tmp_path):
    a, b = _trace(tmp_path / "a.json", 400), _trace(tmp_path / "b.json.gz", 100)
    done = _diff(str(a), str(b))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert f"A: {a}" in done.stdout and f"B: {b}" in done.stdout
    assert "Kernels, per step, largest change first (1 changed, 0 within noise):" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.endswith("  gemm"))
    assert "400.0 µs" in row and "100.0 µs" in row and "-300.0 µs" in row and "×0.25" in row
    diff = json.loads(_diff(str(a), str(b), "--json").stdout)
    assert diff["schema_version"] == 1 and diff["basis"] == "per_step"
    assert set(diff) >= {"a", "b", "noise", "overall", "kernels", "ops", "syncs", "gaps", "warnings"}
    assert diff["kernels"][0]["name"] == "gemm" and diff["kernels"][0]["ratio"] == 0.25


def test_a_folder_of_rank_files_against_a_file(tmp_path):
    folder = tmp_path / "ranks"
    folder.mkdir()
    _trace(folder / "rank0.json", 400, distributedInfo={"rank": 0})
    _trace(folder / "rank1.json", 400, distributedInfo={"rank": 1})
    diff = json.loads(_diff(str(folder), str(_trace(tmp_path / "one.json", 400)), "--json").stdout)
    gemm = diff["kernels"][0]
    # Two ranks ran gemm once per step each: twice the one file's kernel time per (engine) step.
    assert (gemm["a_us"], gemm["b_us"], gemm["a_count"], gemm["b_count"]) == (800, 400, 2, 1)


def test_a_recorded_trace_against_itself_changes_nothing():
    path = str(trace_path("a100-cuda-event-sync.json.gz"))
    done = _diff(path, path, "--top", "3")
    assert done.returncode == 0, done.stderr
    assert "Kernels, per step: no change beyond noise" in done.stdout
    assert "changed," not in done.stdout


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    good = _trace(tmp_path / "a.json", 400)
    done = _diff(str(good), str(tmp_path / "nope.json"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == f"sidecar diff: {tmp_path / 'nope.json'}: no such file or folder\n"


def test_a_corrupt_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    done = _diff(str(bad), str(_trace(tmp_path / "b.json", 400)))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"sidecar diff: {bad}: ") and "gzip" in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_bad_top_is_refused():
    done = _diff("a", "b", "--top", "0")
    assert done.returncode == 2 and "must be at least 1" in done.stderr
