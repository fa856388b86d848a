"""Issue 14, beyond one host. Two "hosts" on one machine: a probe with its own private trace folder that the sidecar
is told not to read (``SIDECAR_PROBE_SEND_FILES=1``: its files come over the probe channel) and a
clock seconds off (a fake engine with ``FAKE_ENGINE_CLOCK_SKEW_S``) has its offset measured over the
channel and its trace, fetched, put on the sidecar's clock in the merged trace, within the
uncertainty the capture reports; a process on the sidecar's own host is never moved. Two engine
instances sharing one sidecar each start at their own step."""

import asyncio
import gzip
import json

from sidecar.service.jobs import arming
from test_service import engines, sidecar, wait_final, wait_processes, wait_step_rates  # noqa: F401 (fixtures)

SKEW_S = 5.05  # half a grid step off the grid: uncorrected, every step would sit 50 ms from it
GRID_MS = 100.0
JITTER_MS = 20.0  # a step's start after its grid instant: the sleep's wake-up on a busy host


async def wait_clocks(client, count, timeout=30):
    for _ in range(int(timeout * 10)):
        body = await (await client.get("/processes")).json()
        procs = body["processes"]
        if len(procs) == count and all(p["clock"] and p["clock"]["samples"] >= 3 for p in procs):
            return procs
        await asyncio.sleep(0.1)
    raise AssertionError(f"no clock estimates: {[p['clock'] for p in procs]}")


def grid_distance_ms(abs_ns: float) -> float:
    grid_ns = GRID_MS * 1e6
    d = abs_ns % grid_ns
    return min(d, grid_ns - d) / 1e6


async def test_a_remote_skewed_process_lands_on_the_sidecars_clock(sidecar, engines, tmp_path):  # noqa: F811
    client = await sidecar()
    grid = ("--grid-ms", str(GRID_MS), "--step-ms", "1")
    remote_root = tmp_path / "other-host"
    engines(client.url, "worker", "--rank", "0", *grid)
    engines(client.url, "worker", "--rank", "1", *grid, env={
        "FAKE_ENGINE_CLOCK_SKEW_S": str(SKEW_S), "SIDECAR_TRACE_DIR": str(remote_root), "SIDECAR_PROBE_SEND_FILES": "1"})
    await wait_processes(client, 2)
    procs = {p["rank"]: p for p in await wait_clocks(client, 2)}
    assert procs[0]["files_shared"] is True and procs[1]["files_shared"] is False

    local, remote = procs[0]["clock"], procs[1]["clock"]
    # Physics, not tolerance: the true offset lies within half the fastest round trip of the estimate.
    assert abs(remote["offset_ms"] - SKEW_S * 1000) <= remote["uncertainty_ms"] + 0.002, remote
    assert remote["applied"] is True
    assert abs(local["offset_ms"]) <= local["uncertainty_ms"] + 0.002 and local["applied"] is False, local

    resp = await client.get("/profile/start", params={"steps": "3", "with_stack": "1"})
    assert resp.status == 202
    status = await wait_final(client, (await resp.json())["id"])
    assert status["state"] == "done", status
    by_rank = {p["rank"]: p for p in status["processes"]}
    assert by_rank[1]["clock"]["applied"] and not by_rank[0]["clock"]["applied"]
    # The remote trace and its sampled stacks came over the channel; the probe deleted its copies.
    assert by_rank[1]["state"] == "done" and by_rank[1]["bytes"] > 0
    assert by_rank[1]["stacks"] == "sampled" and by_rank[1]["stack_summary"]["samples"] > 0, by_rank[1]
    assert not list((remote_root / "captures").rglob("*.json")), "the probe keeps no copy once sent"

    merged = json.loads(gzip.decompress(await (await client.get(status["trace"])).read()))
    base = merged["baseTimeNanoseconds"]
    for rank, proc in by_rank.items():
        starts = [base + e["ts"] * 1000 for e in merged["traceEvents"]
                  if e.get("pid") == proc["pid"] and str(e.get("name", "")).startswith("ProfilerStep#")]
        assert starts, f"rank {rank}: no steps in the merged trace"
        # Every step began on the grid of the true clock; on the merged timeline at least one lies
        # within the uncertainty (plus a wake-up's lateness) of it. Uncorrected, rank 1's would all
        # be 50 ms away.
        nearest = min(grid_distance_ms(t) for t in starts)
        assert nearest <= proc["clock"]["uncertainty_ms"] + JITTER_MS, (rank, nearest, proc["clock"])


async def test_the_recorder_rows_of_a_remote_skewed_process_land_on_the_sidecars_clock(sidecar, engines, tmp_path):  # noqa: F811
    """``GET /recorder`` merges every process's rows on one timeline: the remote process's rows are moved
    by its measured offset, as its trace is in a capture, and the answer says by how much."""
    client = await sidecar()
    grid = ("--grid-ms", str(GRID_MS), "--step-ms", "1")
    engines(client.url, "worker", "--rank", "0", *grid)
    engines(client.url, "worker", "--rank", "1", *grid, env={
        "FAKE_ENGINE_CLOCK_SKEW_S": str(SKEW_S), "SIDECAR_TRACE_DIR": str(tmp_path / "other-host"),
        "SIDECAR_PROBE_SEND_FILES": "1"})
    await wait_processes(client, 2)
    await wait_clocks(client, 2)
    await asyncio.sleep(1.0)  # some steps on the grid
    body = await (await client.get("/recorder", params={"seconds": "30"})).json()
    by_rank = {p["process"]["rank"]: p for p in body["processes"]}
    for rank, proc in by_rank.items():
        clock = proc["process"]["clock"]
        assert proc["error"] is None and len(proc["steps"]) >= 5, (rank, proc["error"])
        if rank == 1:  # what was subtracted is the measured offset, which is the skew within its bound
            assert clock["applied"] and proc["clock_correction_ms"] == clock["offset_ms"], (proc["clock_correction_ms"], clock)
            assert abs(proc["clock_correction_ms"] - SKEW_S * 1000) <= clock["uncertainty_ms"] + 0.002
        else:  # one host: never moved
            assert not clock["applied"] and proc["clock_correction_ms"] == 0, clock
        # Each step began on the true clock's grid: within the uncertainty (and a wake-up's lateness)
        # of it on the sidecar's timeline. Uncorrected, rank 1's would all be 50 ms away.
        nearest = min(grid_distance_ms(row["start_ns"]) for row in proc["steps"])
        assert nearest <= clock["uncertainty_ms"] + JITTER_MS, (rank, nearest, clock)
        # And inside the window the sidecar asked for, on its own clock.
        assert all(body["since_ns"] <= row["end_ns"] and row["start_ns"] <= body["until_ns"] for row in proc["steps"])


async def test_the_recorder_of_a_remote_process_comes_over_the_channel(sidecar, engines, tmp_path):  # noqa: F811
    client = await sidecar()
    remote_root = tmp_path / "other-host"
    engines(client.url, "worker", "--rank", "0", env={"SIDECAR_TRACE_DIR": str(remote_root),
                                                     "SIDECAR_PROBE_SEND_FILES": "1"})
    await wait_processes(client, 1)
    await asyncio.sleep(0.5)  # some steps
    body = await (await client.get("/recorder", params={"seconds": "60"})).json()
    (proc,) = body["processes"]
    assert proc.get("error") is None and len(proc["steps"]) > 10, proc.get("error")
    assert not list((remote_root / "recorder").glob("*.json")), "the dump was deleted once sent"


async def test_two_hosts_processes_with_one_role_rank_and_pid_keep_a_file_each(sidecar, engines, tmp_path):  # noqa: F811
    """Worker rank 0 of two data-parallel servers on two hosts, both pid 7 (as in two containers): each
    one's trace is fetched into a file of its own and kept as one, not the second written over the first.
    Their steps tell them apart: one engine steps every few ms, the other every 40 ms or more."""
    client = await sidecar()
    for host, step_ms in (("host-a", "1"), ("host-b", "40")):
        engines(client.url, "worker", "--rank", "0", "--instance", host, "--step-ms", step_ms, env={
            "FAKE_ENGINE_PID": "7", "FAKE_ENGINE_HOST": host, "SIDECAR_TRACE_DIR": str(tmp_path / host),
            "SIDECAR_PROBE_SEND_FILES": "1"})
    procs = await wait_processes(client, 2)
    assert [(p["pid"], p["rank"], p["files_shared"]) for p in procs] == [(7, 0, False)] * 2, procs
    resp = await client.get("/profile/start", params={"steps": "4", "timeout_s": "30"})
    status = await wait_final(client, (await resp.json())["id"])
    assert status["state"] == "done", status
    by_host = {p["instance"]: p for p in status["processes"]}
    assert sorted(by_host) == ["host-a", "host-b"] and all(p["state"] == "done" for p in by_host.values())
    files = [by_host[h]["file"] for h in ("host-a", "host-b")]
    assert files[0] != files[1] and all(files), files
    capture_dir = tmp_path / "traces" / "captures" / status["id"]
    for host, file in zip(("host-a", "host-b"), files):
        trace = json.loads(gzip.decompress((capture_dir / file).read_bytes()))
        steps = [e["dur"] / 1000 for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
        assert steps, (host, file)
        # ProfilerStep#n spans a step and the engine's pause after it (1 ms on host-a, 40 ms on host-b),
        # but for the last, which ends where recording stopped.
        assert (min(steps) < 30) if host == "host-a" else (min(steps[:-1]) >= 40), (host, steps)


async def test_two_engine_instances_each_start_at_their_own_step(sidecar, engines, monkeypatch):  # noqa: F811
    """Two servers sharing one sidecar count their own steps: one started seconds after the other is
    thousands of steps behind, and a common start step would make it record steps the first one took
    long ago (or wait seconds for them). Each instance gets a start step ahead of its own counts."""
    # As in test_service.py's merge test: the check is of each instance's own start step, so the begin
    # message must reach every process before it (a CI run's worker started 2 steps late, a note).
    monkeypatch.setattr(arming, "BEGIN_LEAD_S", 1.0)
    client = await sidecar()
    engines(client.url, "engine_core", "--instance", "a")
    engines(client.url, "worker", "--rank", "0", "--instance", "a")
    await wait_processes(client, 2)
    await asyncio.sleep(2.0)  # instance a is about a thousand steps ahead
    engines(client.url, "worker", "--rank", "0", "--instance", "b")
    procs = await wait_step_rates(client, 3)
    assert sorted(p["instance"] for p in procs) == ["a", "a", "b"]
    resp = await client.get("/profile/start", params={"steps": "3", "timeout_s": "20"})
    status = await wait_final(client, (await resp.json())["id"])
    assert status["state"] == "done", status
    starts = status["start_steps"]
    assert set(starts) == {"a", "b"} and starts["b"] + 200 < starts["a"], starts
    assert status["start_step"] is None  # no one step is common to both
    for p in status["processes"]:
        assert p["first_step"] == starts[p["instance"]] and p["steps_recorded"] == 3, p


async def test_instance_selects_the_processes_of_one_engine_instance(sidecar, engines):  # noqa: F811
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--instance", "srv")
    engines(client.url, "worker", "--rank", "0", "--instance", "srv/dp1")
    engines(client.url, "worker", "--rank", "0", "--instance", "other")
    await wait_processes(client, 3)
    resp = await client.get("/profile/start", params={"steps": "2", "instance": "srv"})
    status = await wait_final(client, (await resp.json())["id"])
    assert status["state"] == "done" and status["options"]["instance"] == "srv", status
    # A server's own processes and its data-parallel engine cores, not another server's.
    assert sorted(p["instance"] for p in status["processes"]) == ["srv", "srv/dp1"]
    bad = await client.get("/profile/start", params={"steps": "2", "instance": "nope"})
    body = await bad.json()
    assert bad.status == 400 and body["param"] == "instance" and "other" in body["message"], body
    scan = await client.get("/sync/start", params={"steps": "1", "instance": "other"})
    assert scan.status == 202, await scan.json()



SLOW_MS = 200  # every step of instance b holds this long a sleep; instance a's steps take a few ms
SIZES = {"a": 32, "b": 48}  # the side of each instance's step matrix: its aten::mm shapes in a trace



async def shared_volume_engines(engines, client, volume, send_files):  # noqa: F811
    """Two containers of one pod: one host name, both pid 7, worker rank 0 of two engine instances,
    writing to one volume. ``send_files``: the sidecar does not see the volume (their files come over
    the channel); else it reads their files there. One starts once the other is connected: each then
    finds its own marker on the volume (a marker of another pid 7 may look stale to it and go)."""
    for instance, slow in (("a", ()), ("b", ("--slow-step-at", "1", "--slow-step-ms", str(SLOW_MS)))):
        engines(client.url, "worker", "--rank", "0", "--instance", instance, "--step-ms", "1",
                "--size", str(SIZES[instance]), *slow, env={
                    "FAKE_ENGINE_PID": "7", "FAKE_ENGINE_HOST": "pod", "SIDECAR_TRACE_DIR": str(volume),
                    "SIDECAR_PROBE_SEND_FILES": "1" if send_files else ""})
        procs = await wait_processes(client, 1 if instance == "a" else 2)
    assert [(p["pid"], p["rank"], p["host"], p["files_shared"]) for p in procs] == [(7, 0, "pod", not send_files)] * 2, procs


async def test_two_probes_of_one_role_rank_pid_and_host_on_one_disk_write_a_file_each(sidecar, engines, tmp_path):  # noqa: F811
    """Each probe's raw trace is its own file on the shared volume (its name carries host and probe id):
    each process's trace in the capture is its own, not one written over the other or lost."""
    client = await sidecar()
    volume = tmp_path / "shared-volume"
    await shared_volume_engines(engines, client, volume, send_files=False)
    resp = await client.get("/profile/start", params={"steps": "2", "timeout_s": "30", "record_shapes": "1"})
    status = await wait_final(client, (await resp.json())["id"])
    assert status["state"] == "done", status
    by_instance = {p["instance"]: p for p in status["processes"]}
    assert sorted(by_instance) == ["a", "b"] and all(p["state"] == "done" for p in by_instance.values()), status
    capture_dir = tmp_path / "traces" / "captures" / status["id"]
    for instance, proc in by_instance.items():
        trace = json.loads(gzip.decompress((capture_dir / proc["file"]).read_bytes()))
        dims = {json.dumps(e["args"]["Input Dims"]) for e in trace["traceEvents"]
                if e.get("name") == "aten::mm" and "Input Dims" in e.get("args", {})}
        side = SIZES[instance]
        assert dims == {json.dumps([[side, side], [side, side]])}, (instance, dims)
    assert not list(volume.rglob("*.json")), "the sidecar read and deleted each raw file"


async def test_two_probes_of_one_role_rank_pid_and_host_on_one_disk_answer_the_recorder_each(sidecar, engines, tmp_path):  # noqa: F811
    """One query id goes to every probe: their recorder dumps on the shared volume must not be one file."""
    client = await sidecar()
    volume = tmp_path / "shared-volume"
    await shared_volume_engines(engines, client, volume, send_files=True)
    await asyncio.sleep(2.0)  # some steps in each
    body = await (await client.get("/recorder", params={"seconds": "60"})).json()
    by_instance = {p["process"]["instance"]: p for p in body["processes"]}
    assert sorted(by_instance) == ["a", "b"], body["processes"]
    for instance, proc in by_instance.items():
        assert proc["error"] is None and len(proc["steps"]) >= 3, (instance, proc["error"])
        durations_ms = [(row["end_ns"] - row["start_ns"]) / 1e6 for row in proc["steps"]]
        # Instance b's every step holds the sleep; a's hold none, so most of its steps are far shorter.
        assert (min(durations_ms) >= SLOW_MS) if instance == "b" else (min(durations_ms) < SLOW_MS), (instance, durations_ms)
    assert not list((volume / "recorder").glob("*.json")), "each dump was deleted once sent"


def test_a_data_parallel_engine_core_names_its_own_sub_instance(monkeypatch):
    """vLLM reconfigures each data-parallel engine of a dense model as an independent one
    (``data_parallel_size`` 1, ``data_parallel_rank`` 0): only its process's name, ``EngineCore_DP<k>``,
    says which engine it is. The plugin names the sub-instance there; its workers inherit it."""
    from types import SimpleNamespace

    from sidecar.common import config
    from sidecar_vllm.hooks import engine_instance
    from sidecar_vllm.plugin import data_parallel_instance

    assert data_parallel_instance("node-41", "EngineCore_DP0") == "node-41/dp0"
    assert data_parallel_instance("node-41", "EngineCore_DP1") == "node-41/dp1"
    assert data_parallel_instance("node-41/dp1", "EngineCore_DP1") == "node-41/dp1"  # loaded twice: once
    for other in ("EngineCore", "MainProcess", "VllmWorker-0", "EngineCore_DPx"):
        assert data_parallel_instance("node-41", other) == "node-41", other

    independent = SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(
        data_parallel_size=1, data_parallel_rank=0, data_parallel_index=1)))
    monkeypatch.setenv(config.ENV_INSTANCE, "node-41/dp1")  # as engine core 1 set it for its workers
    assert engine_instance(independent, "worker") == "node-41/dp1"
    # A config that still says data parallel (MoE engines keep size and rank) adds nothing twice.
    moe = SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(
        data_parallel_size=2, data_parallel_rank=1)))
    assert engine_instance(moe, "engine_core") == "node-41/dp1"
    monkeypatch.setenv(config.ENV_INSTANCE, "node-41")
    assert engine_instance(moe, "engine_core") == "node-41/dp1"
    assert engine_instance(moe, "api_server") == "node-41"
