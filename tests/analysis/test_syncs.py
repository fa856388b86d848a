"""What the trace's sync findings leave out."""

from .conftest import trace_path


def test_the_profilers_own_stop_synchronize_is_not_a_finding():
    """torch.profiler synchronizes the device when it stops: in the shared training trace that call
    waited 158 ms for queued GPU work. It is every capture's last call at top level, not user code:
    left out of the syncs, reported as profiler_stop_sync_us."""
    from sidecar.analysis.summary import analyze_path

    summary = analyze_path(trace_path("a100-train-queue-rank0.json.gz"))
    (proc,) = summary["processes"]
    assert "cudaDeviceSynchronize" not in {s["name"] for s in proc["syncs"]}, proc["syncs"]
    assert 158_000 <= proc["profiler_stop_sync_us"] <= 158_400
    # A synchronize the user's code makes, inside an op, stays a finding.
    alexnet = analyze_path(trace_path("a100-alexnet.json.gz"))["processes"][0]
    device = [s for s in alexnet["syncs"] if s["name"] == "cudaDeviceSynchronize"]
    assert device and device[0]["count"] == 4 and all(site["site"] for site in device[0]["sites"])
    assert alexnet["profiler_stop_sync_us"] == 14.0
