"""``backend=nsys`` end to end on a host without CUDA: the real sidecar, stand-in engines (tests/fake_engine.py)
over real sockets, the worker's CUDA profiler and NVTX calls recorded to a file (``--nsys-log``, its probe
claiming CUDA). Two workers of one engine start at the same aligned step, push one range per working step
and per phase, balanced, and stop after N; the engine core (no CUDA) is left out and named."""

from __future__ import annotations

from nsys_calls import balanced, read_log
from test_service import engines, sidecar, wait_final, wait_step_rates  # noqa: F401 (fixtures and helpers)

STEPS = 4


async def test_each_worker_starts_at_the_aligned_step_marks_steps_and_phases_and_stops(sidecar, engines, tmp_path):
    client = await sidecar()
    logs = [tmp_path / f"worker{rank}.calls" for rank in (0, 1)]
    engines(client.url, "engine_core", "--step-ms", "5")
    for rank, log in enumerate(logs):
        engines(client.url, "worker", "--rank", str(rank), "--step-ms", "5", "--phases", "--nsys-log", str(log))
    await wait_step_rates(client, 3)
    started = await client.post("/profile/start", params={"steps": str(STEPS), "backend": "nsys"})
    assert started.status == 202, await started.text()
    status = await wait_final(client, (await started.json())["id"], timeout=90)
    assert status["state"] == "done", status
    assert status["backend"] == "nsys" and status["trace"] is None
    assert any("engine core" in note.lower() and "no CUDA" in note for note in status["notes"]), status["notes"]
    assert {p["label"].split(" (")[0] for p in status["processes"]} == {"worker rank 0", "worker rank 1"}

    firsts = set()
    for log, process in zip(logs, sorted(status["processes"], key=lambda p: p["rank"])):
        calls = read_log(log)
        assert calls[0] == ("start",) and calls[-1] == ("stop",) and calls.count(("start",)) == 1, calls[:5]
        assert balanced(calls)
        step_ranges = [c[1] for c in calls if c[0] == "push" and c[1].startswith("step ")]
        first = process["first_step"]
        firsts.add(first)
        assert step_ranges == [f"step {first + i}" for i in range(STEPS)]
        phases = [c[1] for c in calls if c[0] == "push" and not c[1].startswith("step ")]
        assert phases == ["prepare (fake: prepare)", "forward (fake: forward)"] * STEPS
        assert process["nsys"] == {"cuda_profiler": True, "step_ranges": STEPS, "phase_ranges": True}
    assert firsts == {status["start_step"]}  # aligned: both at the sidecar's start step
