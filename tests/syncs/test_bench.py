"""benchmarks/bench_syncs.py runs and writes its JSON (a short run; figures are not asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_syncs.py"


def test_bench_syncs_writes_results(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_syncs", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "syncs.json"
    assert module.main(["--steps", "3", "--rounds", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["median_step_us"]) == {"none", "disarmed", "armed", "armed_cpu", "bare_mode"}
    assert result["aten_ops_per_step"] > 20
    assert result["per_sync"]["armed_us"] > 0
