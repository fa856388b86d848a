"""Every job on a stand-in engine whose worker replays a graph each step (tests/fake_engine.py ``--cuda-graph``;
on a host without CUDA tests/fake_cuda_graph.py stands in for ``torch.cuda.CUDAGraph``), through the real
sidecar over real sockets: module timing and a sync scan say in their notes how many steps replayed a graph
(what they cannot see into) rather than reporting zeros alone; a capture and an nsys capture still end
``done``. tests/gpu/test_cuda_graphs.py checks the same on a real device, kernels included."""

from __future__ import annotations

import asyncio

from nsys_calls import balanced, read_log
from sidecar.common.verdicts import FINAL
from test_service import engines, sidecar, wait_final, wait_step_rates  # noqa: F401 (fixtures and helpers)

STEPS = 3


async def wait_job(client, path, timeout=60):
    for _ in range(int(timeout * 10)):
        body = await (await client.get(path)).json()
        if body["state"] in FINAL:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"{path} still {body['state']}")


async def start(client, route, **params):
    resp = await client.get(route, params={"steps": str(STEPS), **params})
    assert resp.status == 202, await resp.text()
    return await resp.json()


async def test_every_job_on_a_worker_that_replays_a_graph(sidecar, engines, tmp_path):
    client = await sidecar()
    log = tmp_path / "worker.calls"
    engines(client.url, "engine_core", "--step-ms", "5")
    engines(client.url, "worker", "--rank", "0", "--step-ms", "5", "--model", "--cuda-graph", "--nsys-log", str(log))
    await wait_step_rates(client, 2)

    timing = await wait_job(client, (await start(client, "/modules/start"))["url"])
    assert timing["state"] == "done", timing
    [note] = timing["notes"]
    assert note.startswith("worker rank 0") and f"{STEPS} of {STEPS} steps replayed a CUDA graph" in note
    assert "module hooks do not run inside a replay" in note
    assert all(m["calls"] == 0 for m in timing["modules"]) or not timing["modules"]  # nothing seen: said above

    scan = await wait_job(client, (await start(client, "/sync/start"))["url"])
    assert scan["state"] == "done", scan
    notes = " | ".join(scan["notes"])
    assert "worker rank 0" in notes and f"{STEPS} of {STEPS} steps replayed a CUDA graph" in notes
    assert "engine core" not in notes.lower()  # it replays none: nothing to say

    capture = await wait_final(client, (await start(client, "/profile/start"))["id"], timeout=90)
    assert capture["state"] == "done" and capture["trace"], capture

    nsys = await wait_final(client, (await start(client, "/profile/start", backend="nsys"))["id"], timeout=90)
    assert nsys["state"] == "done" and nsys["backend"] == "nsys", nsys
    calls = read_log(log)
    assert calls[0] == ("start",) and calls[-1] == ("stop",) and balanced(calls)
    assert sum(1 for c in calls if c[0] == "push" and c[1].startswith("step ")) == STEPS
