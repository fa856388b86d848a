"""``diff_summaries`` (issue #13): a real change shows with its sign and ratio, an unchanged figure is
noise, rows come largest absolute change first, and a change within the steps' spread is noise. On
traces built so that every figure is known, and on the shared recorded ones."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from sidecar.analysis import analyze_path
from sidecar.analysis.diff import spread
from sidecar.analysis.diff.changes import diff_summaries
from sidecar.analysis.diff.text import format_diff

from . import synth as S
from .conftest import TRACE_NAMES, trace_path

NAMED = ("kernels", "ops", "syncs", "gaps")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "analysis.md"


def _steps(kernel_us: list[dict[str, float]], walls: list[float]) -> list:
    """One ProfilerStep per entry: each kernel launched by cudaLaunchKernel inside aten::mm, run back to back."""
    events, corr, ts = [], 0, 0.0
    for n, (kernels, wall) in enumerate(zip(kernel_us, walls), start=1):
        events.append(S.step(n, ts, wall))
        events.append(S.op("aten::mm", ts + 1, 10))
        at = ts + 20
        for name, dur in kernels.items():
            corr += 1
            events += [S.runtime("cudaLaunchKernel", ts + 2, 1, corr), S.kernel(name, at, dur, corr)]
            at += dur
        ts += wall
    return events


def _summary(tmp_path, name: str, kernel_us, walls, **kwargs) -> dict:
    return analyze_path(S.write(tmp_path / f"{name}.json", _steps(kernel_us, walls)), all_names=True, **kwargs)


def _row(rows: list[dict], name: str) -> dict:
    return next(r for r in rows if r.get("name", r.get("metric")) == name)


@pytest.fixture
def before_after(tmp_path):
    """A: gemm 400 µs, relu 50 µs per step; B: gemm halved, relu the same. Step walls jitter by ±1 %."""
    walls_a = [1000, 1010, 990, 1005, 995]
    walls_b = [800, 808, 792, 804, 796]
    a = _summary(tmp_path, "a", [{"gemm": 400, "relu": 50}] * 5, walls_a)
    b = _summary(tmp_path, "b", [{"gemm": 200, "relu": 50}] * 5, walls_b)
    return a, b


def test_a_real_change_shows_with_its_sign_and_ratio(before_after):
    diff = diff_summaries(*before_after)
    assert diff["basis"] == "per_step" and diff["noise"]["rule"] == "welch"
    gemm = _row(diff["kernels"], "gemm")
    assert (gemm["a_us"], gemm["b_us"], gemm["delta_us"], gemm["ratio"]) == (400, 200, -200, 0.5)
    assert (gemm["a_count"], gemm["b_count"], gemm["delta_count"], gemm["count_ratio"]) == (1, 1, 0, 1.0)
    assert gemm["noise"] is False and gemm["unlisted"] is None
    step = _row(diff["overall"], "step_time_us")
    assert (step["a"], step["b"], step["delta"], step["ratio"]) == (1000, 800, -200, 0.8)
    assert step["noise"] is False
    kernel_time = _row(diff["overall"], "kernel_time_us")
    assert (kernel_time["a"], kernel_time["b"], kernel_time["delta"]) == (450, 250, -200)
    assert _row(diff["kernels"], "relu")["noise"] is True  # unchanged
    # And the other way round: the signs flip, the ratio inverts.
    back = diff_summaries(*reversed(before_after))
    assert _row(back["kernels"], "gemm")["delta_us"] == 200 and _row(back["kernels"], "gemm")["ratio"] == 2.0


def test_identical_inputs_are_all_noise_and_zero(before_after):
    a, _b = before_after
    diff = diff_summaries(a, a)
    assert diff["overall"] and diff["kernels"]
    for key in ("overall", *NAMED):
        for row in diff[key]:
            assert row["noise"] is True, row
            assert row.get("delta", row.get("delta_us")) == 0, row
            if "delta_count" in row:
                assert row["delta_count"] == 0
    assert "no change beyond noise" in format_diff(diff)


def test_rows_are_ordered_by_absolute_change(tmp_path):
    # Changes of -300, +120, -40, +5 µs: listed in that order, whatever their sign.
    a = _summary(tmp_path, "a", [{"k1": 400, "k2": 100, "k3": 100, "k4": 100}] * 3, [1000] * 3)
    b = _summary(tmp_path, "b", [{"k1": 100, "k2": 220, "k3": 60, "k4": 105}] * 3, [1000] * 3)
    rows = diff_summaries(a, b)["kernels"]
    assert [r["name"] for r in rows] == ["k1", "k2", "k3", "k4"]
    assert [r["delta_us"] for r in rows] == [-300, 120, -40, 5]


def test_a_change_within_the_steps_spread_is_noise(tmp_path):
    # Steps spread by ±10 %: a kernel 1 % slower is noise; one twice as slow is not.
    walls = [900, 1100, 950, 1050, 1000, 1000]
    a = _summary(tmp_path, "a", [{"steady": 300, "doubled": 100}] * 6, walls)
    b = _summary(tmp_path, "b", [{"steady": 303, "doubled": 200}] * 6, list(reversed(walls)))
    diff = diff_summaries(a, b)
    # The band: two standard errors of the difference of the mean step times, as a share of A's mean.
    s = spread.stdev([float(w) for w in walls])
    band = 2 * math.sqrt(2 * s * s / 6)
    assert diff["noise"]["step_band_us"] == pytest.approx(band, abs=1e-3)
    assert diff["noise"]["relative_band"] == pytest.approx(band / 1000, abs=1e-4)
    assert _row(diff["overall"], "step_time_us")["noise"] is True  # the same walls, reordered
    steady, doubled = _row(diff["kernels"], "steady"), _row(diff["kernels"], "doubled")
    assert steady["delta_us"] == 3 and steady["noise"] is True
    assert doubled["delta_us"] == 100 and doubled["noise"] is False
    assert [r["name"] for r in diff["kernels"]] == ["doubled", "steady"]
    text = format_diff(diff)
    assert "1 changed, 1 within noise" in text and "doubled" in text


def test_a_kernel_new_in_b_is_a_change_with_no_ratio(tmp_path):
    a = _summary(tmp_path, "a", [{"gemm": 400}] * 3, [1000, 1002, 998])
    b = _summary(tmp_path, "b", [{"gemm": 400, "fused": 30}] * 3, [1000, 1002, 998])
    fused = _row(diff_summaries(a, b)["kernels"], "fused")
    assert (fused["a_us"], fused["b_us"], fused["ratio"], fused["noise"]) == (0, 30, None, False)
    assert " new " in format_diff(diff_summaries(a, b))


def test_no_spread_without_two_complete_steps(tmp_path):
    a = _summary(tmp_path, "a", [{"gemm": 400}, {"gemm": 400}], [1000, 1000])
    one = _summary(tmp_path, "b", [{"gemm": 401}, {"gemm": 401}], [1000, 100])  # the last is cut off
    diff = diff_summaries(a, one)
    assert diff["b"]["complete_steps"] == 1 and diff["noise"]["rule"] == "unchanged_only"
    assert diff["noise"]["relative_band"] is None
    assert _row(diff["kernels"], "gemm")["noise"] is False  # 1 µs, but nothing to call it noise by
    assert any("fewer than 2 complete steps in B" in w for w in diff["warnings"])


def test_without_steps_the_figures_are_per_capture(tmp_path):
    a = analyze_path(S.write(tmp_path / "a.json", [S.runtime("cudaLaunchKernel", 0, 1, 1), S.kernel("k", 5, 10, 1)]), all_names=True)
    b = analyze_path(S.write(tmp_path / "b.json", [S.runtime("cudaLaunchKernel", 0, 1, 1), S.kernel("k", 5, 30, 1)]), all_names=True)
    diff = diff_summaries(a, b)
    assert diff["basis"] == "per_capture" and diff["a"]["step_mean_us"] is None
    assert "step_time_us" not in [r["metric"] for r in diff["overall"]]
    assert _row(diff["overall"], "kernel_time_us")["delta"] == 20
    assert _row(diff["kernels"], "k")["ratio"] == 3.0
    assert any("no complete ProfilerStep in A and B" in w for w in diff["warnings"])


def test_steps_of_different_captures_lengths_compare_per_step(tmp_path):
    a = _summary(tmp_path, "a", [{"gemm": 400}] * 3, [1000] * 3)
    b = _summary(tmp_path, "b", [{"gemm": 400}] * 6, [1000] * 6)
    diff = diff_summaries(a, b)
    assert (diff["a"]["steps"], diff["b"]["steps"]) == (3, 6)
    assert _row(diff["kernels"], "gemm")["delta_us"] == 0 and _row(diff["kernels"], "gemm")["noise"] is True


def test_a_name_outside_a_top_n_list_is_unknown_not_zero(tmp_path):
    # Saved summaries list the top N only: "small" is in A's list but not in B's top 1.
    a = _summary(tmp_path, "a", [{"big": 400, "small": 50}] * 3, [1000] * 3)
    b = analyze_path(S.write(tmp_path / "b.json", _steps([{"big": 300, "small": 50}] * 3, [1000] * 3)), top_n=1)
    diff = diff_summaries(a, b)
    small = _row(diff["kernels"], "small")
    assert small["unlisted"] == "b" and small["b_us"] is None and small["delta_us"] is None and small["noise"] is False
    assert diff["kernels"][-1] is small, "rows with an unknown side come last"
    assert diff["b"]["all_names"] is False and diff["a"]["all_names"] is True
    assert any(w.startswith("B's summary lists only its top kernels") for w in diff["warnings"])
    assert "?" in format_diff(diff, top=50)


def test_all_names_lists_every_name_and_keeps_the_headline():
    path = trace_path("a100-train-step.json.gz")
    every, top = analyze_path(path, all_names=True), analyze_path(path)
    assert every["headline"] == top["headline"]
    assert sum(k["count"] for k in every["gpu"]["top_kernels"]) == every["gpu"]["kernel_count"]
    assert sum(o["count"] for o in every["cpu"]["top_ops"]) == every["cpu"]["op_count"]
    assert every["gpu"]["top_kernels"][:10] == top["gpu"]["top_kernels"]
    assert every["processes"] == top["processes"]


# -- on the recorded traces -----------------------------------------------------------------------------

_REAL: dict[str, dict] = {}


def _real(name: str) -> dict:
    if name not in _REAL:
        _REAL[name] = analyze_path(trace_path(name), all_names=True)
    return _REAL[name]


def test_a_recorded_trace_against_itself_is_all_zero():
    summary = _real("v100-train-large.json.gz")
    diff = diff_summaries(summary, summary)
    assert diff["basis"] == "per_step" and diff["a"]["complete_steps"] == 5
    assert len(diff["kernels"]) == len(summary["gpu"]["top_kernels"])
    for key in ("overall", *NAMED):
        assert all(r.get("delta", r.get("delta_us")) == 0 and r["noise"] for r in diff[key]), key


def test_two_recorded_traces_name_the_expected_top_changes():
    diff = diff_summaries(_real("a100-train-step.json.gz"), _real("a100-train-queue-rank0.json.gz"))
    step = _row(diff["overall"], "step_time_us")
    assert (step["a"], step["b"], step["ratio"], step["noise"]) == (77490.833, 214806.6, 2.772, False)
    # The queue trace blocks on cudaMemcpyAsync for 152 ms a step (12.6 ms in the other): the largest sync
    # change, and the sync-caused idle gaps the largest gap change.
    assert diff["syncs"][0]["name"] == "cudaMemcpyAsync" and diff["syncs"][0]["delta_us"] == pytest.approx(139068.7)
    # (93 ms: torch.profiler's own synchronize at stop, 158 ms in the queue trace, is not a sync)
    assert diff["gaps"][0]["name"] == "sync" and diff["gaps"][0]["delta_us"] > 90_000
    # Its NCCL send/recv kernel has another signature: new in B, the largest kernel change.
    top = diff["kernels"][0]
    assert top["name"].startswith("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*")
    assert top["a_us"] == 0 and top["ratio"] is None and top["delta_us"] == pytest.approx(38069.0)
    deltas = [abs(r["delta_us"]) for r in diff["kernels"]]
    assert deltas == sorted(deltas, reverse=True)


@pytest.mark.skipif(not TRACE_NAMES, reason="recorded traces not found (../shared/traces)")
def test_every_field_and_metric_is_documented_and_the_json_is_strict():
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Comparing two captures: `sidecar diff`"):text.index("## Differences from HTA")]
    documented = set(re.findall(r"`([a-z_A-Z]+)`", section))
    emitted: set[str] = set()
    metrics: set[str] = set()
    # Each recorded trace against itself and against the next: CPU-only, steps and none, several devices.
    for name, other in zip(TRACE_NAMES, TRACE_NAMES[1:] + TRACE_NAMES[:1]):
        for pair in ((name, name), (name, other)):
            diff = diff_summaries(_real(pair[0]), _real(pair[1]))
            assert json.loads(json.dumps(diff, allow_nan=False)) == diff
            stack = [diff]
            while stack:  # every key of every object, names and metrics being values
                item = stack.pop()
                if isinstance(item, dict):
                    emitted.update(item)
                    stack.extend(item.values())
                elif isinstance(item, list):
                    stack.extend(item)
            metrics.update(r["metric"] for r in diff["overall"])
            assert format_diff(diff).startswith("A: ")
    assert not sorted(emitted - documented), f"diff fields missing from docs/analysis.md: {sorted(emitted - documented)}"
    assert metrics == set(spread.FIGURES) and not metrics - documented
