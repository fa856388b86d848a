"""Captures and scans survive a sidecar restart (issue #10, defect 6): the disk is the truth. A new
app on the same trace dir lists what an earlier one finished, serves it, marks what a crash
interrupted (and deletes its leftovers) and applies retention to everything on disk."""

import asyncio
import gzip
import json
import os

from sidecar.common.protocol import CaptureReport
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.routes.keys import JOBS, REGISTRY
from sidecar.common.verdicts import FINAL

from service_fakes import FakeWebSocket, identity

INTERRUPTED = "interrupted: the sidecar stopped during the capture"


def settings(tmp_path, keep=20):
    return ServiceSettings(trace_dir=tmp_path / "traces", probe_token="t", http_token=None, max_steps=50,
                           max_capture_bytes=1 << 30, keep=keep, stop_grace_s=0.3)


def kineto(pid):
    return {"schemaVersion": 1, "baseTimeNanoseconds": 5_000_000_000, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": pid, "tid": pid, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": pid, "ts": 110.0, "dur": 10.0},
    ]}


async def one_capture(client, app, trace_dir):
    """A real capture through the HTTP API with one fake worker whose raw trace the test writes."""
    conn = app[REGISTRY].add(identity("worker", 0), FakeWebSocket())
    start = await client.post("/profile/start?steps=1")
    assert start.status == 202, await start.text()
    capture_id = (await start.json())["id"]
    board = app[JOBS]
    await board.on_report(conn, CaptureReport(job_id=capture_id, state="armed", steps_seen=0))
    await board.on_report(conn, CaptureReport(job_id=capture_id, state="capturing", first_step=2))
    raw = trace_dir / "captures" / capture_id / "raw" / f"{conn.identity.file_stem}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    raw.write_text(json.dumps(kineto(conn.identity.pid)))
    await board.on_report(conn, CaptureReport(job_id=capture_id, state="exporting", steps_recorded=1))
    await board.on_report(conn, CaptureReport(job_id=capture_id, state="done", steps_recorded=1,
                                              file=str(raw), bytes=raw.stat().st_size))
    for _ in range(500):
        body = await (await client.get(f"/profile/{capture_id}")).json()
        if body["state"] in FINAL:
            return body
        await asyncio.sleep(0.01)
    raise AssertionError("capture did not finish")


def killed_capture(trace_dir, capture_id, capture_json=None):
    """A folder as a sidecar killed mid-capture leaves it: raw JSON, a partial gzip, maybe a
    capture.json that is not final (or empty: the disk was full)."""
    folder = trace_dir / "captures" / capture_id
    (folder / "raw").mkdir(parents=True)
    (folder / "raw" / "worker-rank0-pid7.json").write_bytes(b'{"traceEvents": [' + b"0," * 5000)
    (folder / "worker-rank0-pid7.pt.trace.json.gz").write_bytes(gzip.compress(b"{"))
    (folder / "trace.json.tmp").write_bytes(b"partial")
    if capture_json is not None:
        (folder / "capture.json").write_text(capture_json)
    return folder


async def test_finished_captures_are_listed_and_served_after_a_restart(aiohttp_client, tmp_path):
    app = make_app(settings(tmp_path))
    client = await aiohttp_client(app)
    first = await one_capture(client, app, tmp_path / "traces")
    assert first["state"] == "done", first
    trace = await (await client.get(f"/profile/{first['id']}/trace")).read()
    await client.close()

    again = await aiohttp_client(make_app(settings(tmp_path)))
    listed = (await (await again.get("/profiles")).json())["captures"]
    assert [c["id"] for c in listed] == [first["id"]]
    status = await again.get(f"/profile/{first['id']}")
    assert status.status == 200
    assert await status.json() == first, "the restored capture answers as it did before the restart"
    got = await again.get(f"/profile/{first['id']}/trace")
    assert got.status == 200 and await got.read() == trace
    for name, url in first["files"].items():
        assert (await again.get(url)).status == 200, name
    assert (await again.get(f"/profile/{first['id']}/summary")).status == 200


async def test_interrupted_captures_are_failed_and_their_leftovers_deleted(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    no_json = killed_capture(trace_dir, "20250101-000000-aaaaaa")
    running = killed_capture(trace_dir, "20250101-000001-bbbbbb",
                             json.dumps({"id": "20250101-000001-bbbbbb", "state": "capturing", "steps": 4,
                                         "created_at": 1735689601.0, "processes": [], "files": {}}))
    empty = killed_capture(trace_dir, "20250101-000002-cccccc", "")  # a 0-byte capture.json: the disk was full
    not_ours = trace_dir / "captures" / "not-a-capture-id"
    not_ours.mkdir(parents=True)

    client = await aiohttp_client(make_app(settings(tmp_path)))
    listed = (await (await client.get("/profiles")).json())["captures"]
    assert [c["id"] for c in listed] == [empty.name, running.name, no_json.name], "newest first"
    for body in listed:
        assert body["state"] == "failed" and body["reason"] == INTERRUPTED, body
        assert body["files"] == {} and body["trace"] is None
        assert (await client.get(f"/profile/{body['id']}")).status == 200
        assert (await client.get(f"/profile/{body['id']}/trace")).status == 404
    assert listed[1]["steps"] == 4, "what the non-final capture.json knew is kept"
    for folder in (no_json, running, empty):
        assert sorted(os.listdir(folder)) == ["capture.json"], "raw, partial and temporary files are deleted"
        saved = json.loads((folder / "capture.json").read_text())
        assert saved["state"] == "failed" and saved["reason"] == INTERRUPTED
    assert not_ours.is_dir(), "a folder that is not a capture's is left alone"


async def test_retention_applies_to_captures_on_disk(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    app = make_app(settings(tmp_path))
    client = await aiohttp_client(app)
    done = await one_capture(client, app, trace_dir)
    await client.close()
    old = [killed_capture(trace_dir, f"20250101-00000{i}-aaaaa{i}") for i in range(3)]

    again = await aiohttp_client(make_app(settings(tmp_path, keep=2)))
    listed = (await (await again.get("/profiles")).json())["captures"]
    assert [c["id"] for c in listed] == [done["id"], old[2].name]
    assert sorted(p.name for p in (trace_dir / "captures").iterdir()) == sorted([done["id"], old[2].name])
    assert (await again.get(f"/profile/{old[0].name}")).status == 404


async def test_scans_on_disk_are_listed_and_retained_after_a_restart(aiohttp_client, tmp_path):
    scans = tmp_path / "traces" / "scans"
    scans.mkdir(parents=True)
    ids = [f"s2025010{i}-000000-00000{i}" for i in range(1, 4)]
    for n, scan_id in enumerate(ids):
        (scans / f"{scan_id}.json").write_text(json.dumps({
            "id": scan_id, "state": "done", "reason": None, "steps": 2, "delay": 0, "created_at": 1735689600.0 + n,
            "finished_at": 1735689601.0 + n, "treat_cpu_as_device": True, "hidden": 0, "expected": 0, "sites": [],
            "baseline": None, "new_sites": None,
            "processes": [{"role": "worker", "pid": 7, "rank": 0, "label": "worker rank 0 (pid 7)", "state": "done",
                           "steps_recorded": 2, "error": None}]}))
    (scans / "s20250104-000000-000004.json.tmp").write_text("{")  # a save a crash cut short

    client = await aiohttp_client(make_app(settings(tmp_path, keep=2)))
    listed = (await (await client.get("/syncs")).json())
    listed = listed.get("scans", listed)
    assert [s["id"] for s in listed] == [ids[2], ids[1]]
    body = await client.get(f"/sync/{ids[2]}")
    assert body.status == 200 and (await body.json())["processes"][0]["label"] == "worker rank 0 (pid 7)"
    assert sorted(p.name for p in scans.iterdir()) == [f"{ids[1]}.json", f"{ids[2]}.json"]


async def test_a_capture_the_sidecar_dies_in_is_restored_with_what_was_asked(aiohttp_client, tmp_path):
    """capture.json is written when the capture is created, not only when it ends: after a kill the
    restarted sidecar lists it with its steps, options and processes (found on real vLLM: it used
    to show 0 steps, the default timeout and no process)."""
    app = make_app(settings(tmp_path))
    client = await aiohttp_client(app)
    app[REGISTRY].add(identity("worker", 0), FakeWebSocket())
    start = await client.post("/profile/start?steps=30&timeout_s=900&record_shapes=1")
    assert start.status == 202, await start.text()
    capture_id = (await start.json())["id"]
    # The sidecar is killed here: nothing more of this app runs (no report, no shutdown).

    again = await aiohttp_client(make_app(settings(tmp_path)))
    body = await (await again.get(f"/profile/{capture_id}")).json()
    assert body["state"] == "failed" and body["reason"] == INTERRUPTED, body
    assert body["steps"] == 30 and body["options"]["timeout_s"] == 900 and body["options"]["record_shapes"] is True
    assert [(p["role"], p["state"]) for p in body["processes"]] == [("worker", "lost")], body["processes"]


async def test_module_timings_on_disk_are_listed_and_retained_after_a_restart(aiohttp_client, tmp_path):
    """Module timings are saved as scans are (one JSON file each, ``saved_jobs.SavedAsOneFile``): a
    restarted sidecar lists and serves them, deletes a cut-short save and an unreadable file, and
    applies retention."""
    folder = tmp_path / "traces" / "modules"
    folder.mkdir(parents=True)
    ids = [f"m2025010{i}-000000-00000{i}" for i in range(1, 4)]
    for n, job_id in enumerate(ids):
        (folder / f"{job_id}.json").write_text(json.dumps({
            "id": job_id, "state": "done", "reason": None, "steps": 2, "delay": 0, "created_at": 1735689600.0 + n,
            "finished_at": 1735689601.0 + n, "start_step": 4, "notes": [], "clock": "cpu", "hooks_left": 0,
            "forward_ms": 1.5, "forward_ms_per_step": 0.75,
            "modules": [{"path": "model.layers.0", "type": "LlamaDecoderLayer", "calls": 2, "total_ms": 1.0}],
            "types": [], "processes": [{"role": "worker", "pid": 7, "rank": 0, "label": "worker rank 0 (pid 7)",
                                        "state": "done", "steps_recorded": 2, "error": None, "clock": "cpu",
                                        "hooks_before": 0, "hooks_after": 0}]}))
    (folder / "m20250104-000000-000004.json.tmp").write_text("{")  # a save a crash cut short
    (folder / "m20250105-000000-000005.json").write_text('{"id": "m20250105-000000-000005"')  # corrupt

    client = await aiohttp_client(make_app(settings(tmp_path, keep=2)))
    listed = (await (await client.get("/modules")).json())["jobs"]
    assert [j["id"] for j in listed] == [ids[2], ids[1]]
    body = await client.get(f"/modules/{ids[2]}")
    assert body.status == 200
    served = await body.json()
    assert served["modules"][0]["type"] == "LlamaDecoderLayer" and served["processes"][0]["label"] == "worker rank 0 (pid 7)"
    assert sorted(p.name for p in folder.iterdir()) == [f"{ids[1]}.json", f"{ids[2]}.json"]
