"""The analysis of a capture whose worker replays a CUDA graph (vLLM's decode steps): in a Kineto trace a
replay is one ``cudaGraphLaunch`` on the host, and each kernel of the graph carries that launch's
correlation id. On a hand-built trace (tests/analysis/synth.py) every figure of which is known: the
graph's kernels count in their step, their launch in the step's launches, and they belong to the phase
whose range holds the launch (the device idle between two forwards is measured from them)."""

from __future__ import annotations

from analysis.synth import kernel, op, process_name, runtime, step, write
from sidecar.analysis import analyze_path

WORKER = 20
TABLE = {"w: forward": "forward", "w: sample": "sample"}


def ann(name, ts, dur):
    return op(name, ts, dur, cat="user_annotation", pid=WORKER, tid=WORKER)


def replaying_worker(steps=3):
    events = [process_name(WORKER, "worker rank 0 (pid 20)")]
    for k in range(steps):
        w = 1000.0 * k
        events += [step(k, w, 1000, pid=WORKER, tid=WORKER), ann("w: forward", w + 10, 400),
                   runtime("cudaGraphLaunch", w + 20, 10, corr=k, pid=WORKER, tid=WORKER)]
        events += [kernel(f"graph_kernel_{j}", w + 50 + 100 * j, 90, corr=k) for j in range(3)]  # one launch, 3 kernels
        events += [ann("w: sample", w + 500, 100),
                   runtime("cudaLaunchKernel", w + 510, 5, corr=100 + k, pid=WORKER, tid=WORKER),
                   kernel("argmax", w + 520, 20, corr=100 + k)]
    return events


def test_the_kernels_of_a_replayed_graph_count_in_their_step_and_phase(tmp_path):
    path = write(tmp_path / "graph.json", replaying_worker(), inference_sidecar={"phase_ranges": TABLE, "whole_steps": True})
    summary = analyze_path(path)
    steps = summary["steps"]
    assert [s["kernel_count"] for s in steps] == [4, 4, 4]
    assert [s["kernel_time_us"] for s in steps] == [290.0] * 3  # 3 x 90 of the graph, 20 of the argmax
    assert [s["launch_count"] for s in steps] == [2, 2, 2]  # the graph's launch is one, as on the host
    assert steps[0]["top_kernel"].startswith("graph_kernel_")
    assert summary["launches"]["count"] == 6
    (between,) = summary["anatomy"]["between_forwards"]
    # The forward's last graph kernel ends at W+340, the next forward's first begins at W+1050; the
    # argmax (20 µs) runs between: 690 µs idle. Without the graph's kernels there would be no forward
    # on the device at all.
    assert [r["device_idle_us"] for r in between["steps"]] == [690.0, 690.0]
