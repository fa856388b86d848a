"""A memory snapshot on a real device (issue 32 item 1): the worker records torch's own CUDA caching
allocator for N steps, its summary names the stand-in engine's line that allocates each step's product,
and the raw snapshot is the pickle PyTorch's viewer reads. The engine core and the API server have no
CUDA and are not in the job."""

import pickle

STEPS = 3


def test_a_memory_snapshot_reads_the_real_allocator(gpu_host, tmp_path):
    with gpu_host() as host:
        host.standard_engine()
        started = host.client.request("POST", "/memory/start", {"steps": STEPS, "max_entries": 20000})
        assert [p.split(" (")[0] for p in started["processes"]] == ["worker rank 0"], started
        job = host.client.wait(started["id"], timeout=180, path="/memory/")
        assert job["state"] == "done", job
        [process] = job["processes"]
        s = process["summary"]
        assert process["steps_recorded"] == STEPS and len(s["steps"]) == STEPS
        # Each step's product is a new tensor: at least one allocation per step, freed again.
        assert all(r["allocations"] >= 1 for r in s["steps"]), s["steps"]
        assert s["peak"]["allocated_bytes"] >= s["end"]["allocated_bytes"] > 0
        assert s["end"]["reserved_bytes"] >= s["end"]["allocated_bytes"]
        assert any("fake_engine.py" in r["site"] for r in s["peak"]["sites"]), s["peak"]["sites"]
        path = tmp_path / "snapshot.pickle"
        host.client.download(process["download"], path)
        snapshot = pickle.loads(path.read_bytes())  # written by this test's own engine
        assert "segments" in snapshot and sum(len(t) for t in snapshot["device_traces"]) == s["entries"]
