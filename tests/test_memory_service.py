"""/memory/* (issue 32 item 1) against real probes over real sockets, each with the CUDA allocator
stand-in (tests/fake_cuda_allocator.py: ``StandInWorker``, a real Probe stepping on a thread of this
process). The life cycle, one start step for every worker, exactly N steps, the summary's figures
against what the stand-in allocated, the raw snapshots (read where they lie, and fetched over the
channel), the page, a restart, and every refusal."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import pickle
import re
from pathlib import Path

import pytest

from fake_cuda_allocator import STEP_ALLOCS, WEIGHT_BYTES, StandInWorker, rounded, site
from sidecar.cli import memory as memory_cli
from sidecar.cli.memory import describe_memory
from sidecar.common.verdicts import FINAL
from sidecar.probe.memory_summary import BEFORE
from test_service import PROBE_TOKEN, sidecar, wait_processes, wait_step_rates  # noqa: F401  (fixtures)

API_MD = Path(__file__).resolve().parents[1] / "docs" / "api.md"
STEP_BYTES = sum(rounded(size) for size, _, _ in STEP_ALLOCS)


@pytest.fixture
def workers(tmp_path, monkeypatch):
    monkeypatch.setenv("SIDECAR_TOKEN", PROBE_TOKEN)
    made: list[StandInWorker] = []

    def start(url: str, rank: int, *, send_files: bool = False, **kw) -> StandInWorker:
        # SIDECAR_PROBE_SEND_FILES: this probe's files are fetched over the channel, as from another host.
        with monkeypatch.context() as m:
            if send_files:
                m.setenv("SIDECAR_PROBE_SEND_FILES", "1")
            worker = StandInWorker(url, rank, str(tmp_path / f"probe-root-{rank}"), **kw)
        made.append(worker.start())
        return worker

    yield start
    for worker in made:
        worker.close()


async def wait_job(client, job_id, timeout=60, states=None):
    for _ in range(int(timeout * 20)):
        body = await (await client.get(f"/memory/{job_id}")).json()
        if states is not None and (not states or states[-1] != body["state"]):
            states.append(body["state"])
        if body["state"] in FINAL:
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"memory snapshot still {body['state']}")


def run_cli(*argv: str) -> tuple[int, str]:
    """``sidecar ARGV`` in this process (on a thread of its own: the sidecar it calls runs on this loop)."""
    parser = argparse.ArgumentParser()
    memory_cli.register(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = args.handler(args)
    return code, printed.getvalue()


def documented_example() -> dict:
    text = API_MD.read_text()
    block = text[text.index("### `GET /memory/{id}`"):]
    return json.loads(re.search(r"```json\n(.*?)```", block, re.S).group(1))


async def test_every_worker_with_cuda_records_the_same_steps_and_its_snapshot_comes_back(
        sidecar, workers, tmp_path):  # noqa: F811
    client = await sidecar()
    local = workers(client.url, 0)
    remote = workers(client.url, 1, send_files=True)
    workers(client.url, 2, cuda=False)  # no CUDA: not in the job
    # Aligned starts need a step rate for the begin's lead (the stand-ins have no flight recorder to
    # send one with "armed": the sidecar's, from their heartbeats).
    await wait_step_rates(client, 3)

    resp = await client.get("/memory/start", params={"steps": "3", "max_entries": "5000"})
    assert resp.status == 202, await resp.text()
    started = await resp.json()
    assert started["id"].startswith("g") and started["url"] == f"/memory/{started['id']}"
    assert sorted(p.split(" (")[0] for p in started["processes"]) == ["worker rank 0", "worker rank 1"]
    for path, error in (("/profile/start", "memory_snapshot_in_progress"), ("/modules/start", None),
                        ("/sync/start", None)):
        busy = await client.get(path, params={"steps": "1"})
        body = await busy.json()
        assert busy.status == 409 and body["active"] == started["id"], body
        assert error is None or body["error"] == error
    download_early = await client.get(f"/memory/{started['id']}/files/worker-rank0-pid1.pickle")
    states: list[str] = []
    job = await wait_job(client, started["id"], states=states)
    assert download_early.status in (404, 409)  # not ready (409), or not a name of this job (404)
    assert job["state"] == "done", job
    assert states[0] in ("armed", "recording") and states[-1] == "done"
    assert set(states) <= {"armed", "recording", "done"}

    procs = {p["rank"]: p for p in job["processes"]}
    assert sorted(procs) == [0, 1]
    # One start step for both, and both began there: the same steps of the engine, exactly three.
    assert job["start_step"] is not None and job["notes"] == []
    for rank, worker in ((0, local), (1, remote)):
        p = procs[rank]
        assert p["state"] == "done" and p["steps_recorded"] == 3 and p["first_step"] == job["start_step"]
        s = p["summary"]
        assert s["allocations"] == s["frees"] == 3 * len(STEP_ALLOCS) and s["truncated"] is False
        assert [r["allocations"] for r in s["steps"]] == [len(STEP_ALLOCS)] * 3
        assert s["peak"]["allocated_bytes"] == WEIGHT_BYTES + STEP_BYTES
        assert s["end"]["allocated_bytes"] == WEIGHT_BYTES and s["end"]["reserved_bytes"] == worker.allocator.reserved()
        sites = {r["site"]: r["bytes"] for r in s["peak"]["sites"]}
        assert sites == {BEFORE: WEIGHT_BYTES, **{site(line, name): rounded(size) for size, line, name in STEP_ALLOCS}}
        assert worker.allocator.starts == [5000] and worker.allocator.stops == 1 and not worker.allocator.recording
        # The raw snapshot, here now, whether read where it lay (rank 0) or fetched (rank 1).
        assert p["file"] and p["download"] == f"/memory/{job['id']}/files/{p['file']}"
        raw = await client.get(p["download"])
        assert raw.status == 200 and raw.headers["Content-Type"] == "application/octet-stream"
        data = await raw.read()
        assert len(data) == p["bytes"] > 0
        snapshot = pickle.loads(data)  # this test's own stand-in wrote it
        assert len(snapshot["device_traces"][0]) == s["entries"]
    assert job["peak"]["allocated_bytes"] == WEIGHT_BYTES + STEP_BYTES
    # The probes' own copies are gone: nothing left under their roots' captures/.
    for rank in (0, 1):
        assert not list((tmp_path / f"probe-root-{rank}" / "captures").glob("**/*.pickle"))

    missing = await client.get(f"/memory/{job['id']}/files/..%2Fmemory.json")
    assert missing.status == 404 and (await missing.json())["error"]
    assert (await client.get(f"/memory/{job['id']}/files/worker-rank9-pid1.pickle")).status == 404

    # What docs/api.md shows is what the service returns.
    doc = documented_example()
    assert set(doc) == set(job), set(doc) ^ set(job)
    assert set(doc["processes"][0]) == set(procs[0]), set(doc["processes"][0]) ^ set(procs[0])
    doc_s, s = doc["processes"][0]["summary"], procs[0]["summary"]
    assert set(doc_s) == set(s), set(doc_s) ^ set(s)
    for key in ("start", "end", "peak", "fragmentation", "raw_file"):
        assert set(doc_s[key]) == set(s[key]), key
    assert set(doc_s["steps"][0]) == set(s["steps"][0]) and set(doc_s["peak"]["sites"][0]) == set(s["peak"]["sites"][0])

    page = await client.get(job["page"])
    html = await page.text()
    assert page.status == 200 and "script-src 'none'" in page.headers["Content-Security-Policy"]
    assert "stand_in_model.py:20 (mlp)" in html and "<polyline" in html and p["download"] in html
    text = describe_memory(job)
    assert "live at the peak" in text and "stand_in_model.py:20 (mlp)" in text

    listed = (await (await client.get("/memory")).json())["jobs"]
    assert [j["id"] for j in listed] == [job["id"]] and listed[0] == job

    # sidecar memory ID -o DIR: the job again, and each raw snapshot saved; --list the recent ones.
    out = tmp_path / "snapshots"
    code, printed = await asyncio.to_thread(run_cli, "memory", job["id"], "--url", client.url, "-o", str(out))
    assert code == 0 and "stand_in_model.py:20 (mlp)" in printed and printed.count("saved ") == 2, printed
    assert sorted(f.stat().st_size for f in out.iterdir()) == sorted(p["bytes"] for p in job["processes"])
    code, printed = await asyncio.to_thread(run_cli, "memory", "--list", "--url", client.url)
    assert code == 0 and job["id"] in printed and "worker rank" in printed

    # A restarted sidecar on the same trace dir lists it and serves its files; the folder of a job it
    # never saved (a sidecar killed before the verdict) is deleted.
    orphan = tmp_path / "traces" / "memory" / "g20200101-000000-aaaaaa"
    orphan.mkdir()
    (orphan / "worker-rank0-pid1.pickle").write_bytes(b"left over")
    again = await sidecar()
    assert not orphan.exists()
    relisted = (await (await again.get("/memory")).json())["jobs"]
    assert [j["id"] for j in relisted] == [job["id"]]
    assert relisted[0]["processes"][0]["summary"] == job["processes"][0]["summary"]
    raw = await again.get(procs[0]["download"])
    assert raw.status == 200 and len(await raw.read()) == procs[0]["bytes"]


async def test_refusals_a_stop_a_timeout_and_retention(sidecar, workers, tmp_path):  # noqa: F811
    client = await sidecar(keep=1)
    none = await client.get("/memory/start", params={"steps": "2"})
    assert none.status == 503 and (await none.json())["error"] == "no_engine_processes"
    workers(client.url, 0, cuda=False)
    await wait_processes(client, 1)
    no_cuda = await client.get("/memory/start", params={"steps": "2"})
    body = await no_cuda.json()
    assert no_cuda.status == 400 and body["error"] == "no_cuda" and body["param"] == "processes"
    assert "no selected process has CUDA" in body["message"] and "worker rank 0" in body["message"]

    slow = workers(client.url, 1, step_ms=150)
    await wait_processes(client, 2)
    for params, name in [({"steps": "0"}, "steps"), ({"steps": "21"}, "steps"), ({"steps": "x"}, "steps"), ({}, "steps"),
                         ({"steps": "2", "max_entries": "0"}, "max_entries"),
                         ({"steps": "2", "max_entries": "1000001"}, "max_entries"),
                         ({"steps": "2", "max_entries": "many"}, "max_entries"),
                         ({"steps": "2", "what": "1"}, "what"), ({"steps": "2", "timeout_s": "0"}, "timeout_s"),
                         ({"steps": "2", "processes": "gpu"}, "processes")]:
        resp = await client.get("/memory/start", params=params)
        assert resp.status == 400, params
        body = await resp.json()
        assert body["error"] == "bad_parameter" and body["param"] == name, (params, body)
    only_the_other = await client.get("/memory/start", params={"steps": "2", "processes": "worker:0"})
    assert only_the_other.status == 400 and (await only_the_other.json())["error"] == "no_cuda"

    # Stopped while recording: what was recorded is kept, the job is partial, naming the stop.
    started = await (await client.post("/memory/start", params={"steps": "20"})).json()
    for _ in range(400):
        if (await (await client.get(f"/memory/{started['id']}")).json())["state"] == "recording":
            break
        await asyncio.sleep(0.05)
    while slow.probe.steps < 2 + ((await (await client.get(f"/memory/{started['id']}")).json())["start_step"] or 0):
        await asyncio.sleep(0.05)
    assert (await client.post("/memory/stop")).status == 200
    job = await wait_job(client, started["id"])
    [p] = job["processes"]
    assert job["state"] == "partial" and "stopped by request" in job["reason"], job
    assert 1 <= p["steps_recorded"] < 20 and len(p["summary"]["steps"]) == p["steps_recorded"]
    assert p["summary"]["allocations"] == p["steps_recorded"] * len(STEP_ALLOCS) and p["file"]
    assert (await client.post("/memory/stop")).status == 409
    partial = job
    assert (tmp_path / "traces" / "memory" / partial["id"] / p["file"]).is_file()

    # An idle engine: stopped while armed, the job is cancelled and the allocator never touched.
    slow.idle()
    before = list(slow.allocator.starts)
    armed = await (await client.post("/memory/start", params={"steps": "2"})).json()
    stopped = await client.post("/memory/stop")
    assert stopped.status == 200
    job = await wait_job(client, armed["id"])
    assert job["state"] == "cancelled" and slow.allocator.starts == before

    # The timeout ends a job whose steps do not come, naming it.
    timed = await (await client.post("/memory/start", params={"steps": "2", "timeout_s": "0.5"})).json()
    job = await wait_job(client, timed["id"])
    assert job["state"] == "failed" and "timeout after 0.5 s" in job["reason"], job
    # --keep 1: only the newest finished job is kept, the raw snapshots of the others deleted with them.
    assert [j["id"] for j in (await (await client.get("/memory")).json())["jobs"]] == [timed["id"]]
    assert not (tmp_path / "traces" / "memory" / partial["id"]).exists()
    assert (await client.get(partial["processes"][0]["download"])).status == 404
    assert (await client.get("/memory/g20990101-000000-abcdef")).status == 404


async def test_the_bounds_a_raw_snapshot_too_large_and_a_full_history(sidecar, workers):  # noqa: F811
    client = await sidecar(max_capture_bytes=200)  # a raw snapshot of even 4 entries is about 1 KB
    workers(client.url, 0)
    await wait_processes(client, 1)
    started = await (await client.post("/memory/start", params={"steps": "2", "max_entries": "4"})).json()
    job = await wait_job(client, started["id"])
    [p] = job["processes"]
    assert job["state"] == "done" and p["file"] is None and p["download"] is None
    assert any("raw snapshot over the limit of" in n and "not kept" in n for n in job["notes"]), job["notes"]
    assert any("the history held 4 entries" in n for n in job["notes"]), job["notes"]
    s = p["summary"]
    assert s["truncated"] is True and s["entries"] == 4 and s["raw_file"]["kept"] is False
    # The peak is read from the snapshot's own state at its end: whole, whatever the ring dropped.
    assert s["end"]["allocated_bytes"] == WEIGHT_BYTES
