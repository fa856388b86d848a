"""Top kernels agree with Holistic Trace Analysis' kernel breakdown, and every difference is one of
the rules written in docs/analysis.md ("Differences from HTA"):

1. HTA keeps only kernels whose correlation id matches a CPU-side call made before the end of the
   last ProfilerStep (with include_last_profiler_step=True; by default it also drops the last step);
   kernels with no launch record (CUDA graph replays in a100-train-queue-rank0) disappear from it.
2. HTA rounds nanosecond timestamps to whole microseconds (start up, end down) before summing.
3. HTA treats any event with a ``stream`` argument as a GPU kernel: CUPTI's "Stream Wait Event"
   records and, in a100-triton, the Inductor CPU op that launches the Triton kernel.

Here HTA's numbers are recomputed from plain JSON with those rules and must match exactly, while
the analyser's own numbers match the plain count with no rule at all (test_counts.py).
"""

from __future__ import annotations

import logging
import shutil
import warnings

import pytest

from . import plain
from .conftest import TRACE_NAMES, load_plain, trace_path

pytestmark = [
    pytest.mark.skipif(not TRACE_NAMES, reason="recorded traces not found (../shared/traces)"),
    pytest.mark.filterwarnings("ignore"),  # pandas deprecation warnings from inside HTA
]

# Traces on which none of the rules changes a kernel total: HTA and the analyser agree as they are.
IDENTICAL = ["a100-cuda-event-sync.json.gz", "a100-train-step.json.gz", "v100-train-large.json.gz"]
GPU_TRACES = [n for n in TRACE_NAMES if n != "cpu-only-tiny.json.gz"]


@pytest.fixture(scope="module")
def hta_breakdown(tmp_path_factory):
    warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis

    cache: dict[str, dict[str, tuple[float, float]]] = {}

    def get(name: str) -> dict[str, tuple[float, float]]:
        if name not in cache:
            folder = tmp_path_factory.mktemp(name.split(".")[0])
            shutil.copy(trace_path(name), folder / name)
            previous = logging.root.manager.disable
            logging.disable(logging.WARNING)  # HTA logs every parsing stage
            try:
                analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
                _, frame = analysis.get_gpu_kernel_breakdown(visualize=False, num_kernels=1_000_000, duration_ratio=1.0)
            finally:
                logging.disable(previous)
            # Memcpy/memset rows can appear even without include_memory_kernels: keep kernels only.
            kernels = frame[frame["kernel_type"].isin(["COMPUTATION", "COMMUNICATION"])]
            cache[name] = {row["name"]: (row["sum (us)"], row["mean (us)"]) for _, row in kernels.iterrows()}
        return cache[name]

    return get


def _expected_hta(trace: dict) -> dict[str, list]:
    steps = [e for e in plain.events(trace, "user_annotation") if e["name"].startswith("ProfilerStep#")]
    if len(steps) >= 2:  # rule 1
        last_end = max(e["ts"] + e["dur"] for e in steps)
        launched = {
            e["args"]["correlation"]
            for e in trace["traceEvents"]
            if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}) and e["ts"] <= last_end
        }
        return plain.per_name(trace, only=lambda e: e["args"].get("correlation") in launched, hta_rounding=True)
    return plain.per_name(trace, hta_rounding=True)


@pytest.mark.parametrize("name", IDENTICAL)
def test_top_kernels_match_hta(name, summary_of, hta_breakdown):
    hta = hta_breakdown(name)
    hta_top = sorted(hta.items(), key=lambda kv: (-kv[1][0], kv[0]))[:10]
    ours = summary_of(name, top_n=10)["gpu"]["top_kernels"]
    assert [k["name"] for k in ours] == [kname for kname, _ in hta_top]
    for kernel, (_, (total, mean)) in zip(ours, hta_top):
        assert kernel["total_us"] == pytest.approx(total, abs=1e-3)
        assert kernel["count"] == round(total / mean)


@pytest.mark.parametrize("name", GPU_TRACES)
def test_hta_differences_are_the_documented_ones(name, summary_of, hta_breakdown):
    trace = load_plain(trace_path(name))
    expected = _expected_hta(trace)
    hta = hta_breakdown(name)
    # Rule 3: rows HTA takes for kernels that are not kernels.
    stream_wait = hta.pop("Stream Wait Event", None)
    cuda_sync_names = {e["name"] for e in plain.events(trace, "cuda_sync")}
    assert stream_wait is None or "Stream Wait Event" in cuda_sync_names
    cpu_ops_with_stream = {e["name"] for e in plain.events(trace, "cpu_op") if "stream" in e.get("args", {})}
    for kname in cpu_ops_with_stream & set(hta):
        assert hta.pop(kname)[0] > expected.pop(kname)[1]  # HTA counted the CPU op's much longer span
    assert set(hta) == {k for k, (count, _) in expected.items() if count}
    for kname, (total, _mean) in hta.items():
        assert total == pytest.approx(expected[kname][1], abs=1e-6), kname
    # ...while the analyser reports every kernel the GPU ran, at full resolution.
    ours = {k["name"]: k["total_us"] for k in summary_of(name)["gpu"]["top_kernels"]}
    assert set(hta) <= set(ours)


def test_rules_matter_on_the_traces_they_name(hta_breakdown, summary_of):
    """Rule 1 and 2 change totals where the docs say they do (so the test above is not vacuous)."""
    queue = summary_of("a100-train-queue-rank0.json.gz")["gpu"]
    hta_queue = sum(total for total, _ in hta_breakdown("a100-train-queue-rank0.json.gz").values())
    assert hta_queue < queue["kernel_time_us"] - 1000  # kernels without a launch record
    nccl = summary_of("a100-nccl-multistream.json.gz")["gpu"]
    hta_nccl = sum(total for total, _ in hta_breakdown("a100-nccl-multistream.json.gz").values())
    assert 0 < nccl["kernel_time_us"] - hta_nccl <= nccl["kernel_count"]  # at most 1 µs per kernel lost to rounding
