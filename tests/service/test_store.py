"""The object store's pieces against obstore's own local and in-memory stores: the keys, the upload
queue (stored, retried, refused, dropped), and a sidecar with stand-in engines that uploads a capture
to a shared folder (file://) and a second sidecar, on an empty disk, that lists and serves it."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import obstore
import pytest
from obstore.store import LocalStore, MemoryStore
from prometheus_client import CollectorRegistry

from sidecar.service.jobs.model import CAPTURE
from sidecar.service.jobs.params import ParamError, parse_capture_request
from sidecar.service.store import client, layout
from sidecar.service.store.counters import StoreCounters
from sidecar.service.store.uploads import Upload, Uploader, new_status
from service_fakes import until
from test_service import engines, sidecar, wait_final, wait_processes  # noqa: F401 (fixtures)


def _count(registry: CollectorRegistry, name: str, **labels) -> float:
    return registry.get_sample_value(name, labels or None) or 0.0


def _upload(tmp_path: Path, name: str, data: bytes = b"x" * 100, changes: list | None = None) -> Upload:
    path = tmp_path / "local" / f"{name.replace('/', '_')}.bin"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    status = new_status(f"memory:///{name}/")
    return Upload(kind="capture", name=name, status=status, files=[(f"{name}/file.bin", path)],
                  document=(f"{name}/capture.json", lambda: json.dumps({"id": name}).encode()),
                  on_change=(lambda: changes.append(dict(status))) if changes is not None else None)


# -- the keys ------------------------------------------------------------------------------------------------
def test_layout_names_captures_alone_and_in_a_fleet():
    lay = layout.StoreLayout("s3://user:secret@bucket/pre/fix?sig=abc", "pod/7 x")
    assert lay.url == "s3://bucket/pre/fix"  # no user, password or query in what is shown
    assert lay.instance == "pod_7_x"
    cid = CAPTURE.new_id()
    assert lay.capture_prefix(cid) == f"captures/{cid}/"
    assert lay.capture_prefix(cid, "f1") == f"fleets/f1/pod_7_x/{cid}/"
    assert layout.capture_of(f"captures/{cid}/capture.json", CAPTURE.is_id) == (cid, f"captures/{cid}/")
    assert layout.capture_of(f"fleets/f1/pod_7_x/{cid}/capture.json", CAPTURE.is_id) == (cid, f"fleets/f1/pod_7_x/{cid}/")
    for bad in (f"captures/{cid}/trace.json.gz", "captures/nope/capture.json", f"fleets/a b/x/{cid}/capture.json",
                f"captures/x/{cid}/capture.json"):
        assert layout.capture_of(bad, CAPTURE.is_id) is None, bad


def test_store_urls_are_checked():
    assert client.url_problem("s3://bucket/prefix") is None
    assert client.url_problem("file:///shared") is None
    assert "bucket" in client.url_problem("s3://")
    assert "must be one of" in client.url_problem("ftp://host/x")
    assert "absolute" in client.url_problem("file://relative")


def test_a_store_error_is_named_without_its_secrets():
    exc = RuntimeError("Error performing PUT https://acct.blob.core.windows.net/c/k?sv=2024&sig=SECRET in 3ms - "
                       "403 Forbidden: <?xml version=\"1.0\"?><Error><Code>AuthenticationFailed</Code>"
                       "<Message>Server failed to authenticate the request.</Message></Error>")
    said = client.describe(exc)
    assert "SECRET" not in said and "sv=" not in said
    assert said.startswith("RuntimeError [AuthenticationFailed: Server failed to authenticate the request.]: ")
    assert said.endswith("https://acct.blob.core.windows.net/c/k?… in 3ms - 403 Forbidden")


def test_the_fleet_parameter_is_a_short_id():
    assert parse_capture_request({"steps": "2", "fleet": "f-1_A"}, 10).fleet == "f-1_A"
    assert parse_capture_request({"steps": "2"}, 10).fleet is None
    for bad in ("", "a/b", "../x", "a" * 65, "é"):
        with pytest.raises(ParamError) as err:
            parse_capture_request({"steps": "2", "fleet": bad}, 10)
        assert err.value.param == "fleet"


# -- the upload queue --------------------------------------------------------------------------------------
async def test_an_upload_stores_its_files_then_its_record(tmp_path):
    registry, store = CollectorRegistry(), MemoryStore()
    uploader, changes = Uploader(store, StoreCounters(registry)), []
    up = _upload(tmp_path, "one", b"abc" * 1000, changes)
    uploader.submit(up)
    await until(lambda: up.status["state"] == "stored")
    assert bytes(obstore.get(store, "one/file.bin").bytes()) == b"abc" * 1000
    assert json.loads(bytes(obstore.get(store, "one/capture.json").bytes())) == {"id": "one"}
    assert [c["state"] for c in changes] == ["uploading", "stored"]
    assert _count(registry, "sidecar_store_uploads_total", kind="capture", outcome="stored") == 1
    assert _count(registry, "sidecar_store_upload_bytes_total") == 3000 + len(b'{"id": "one"}')
    await uploader.close()


async def test_a_store_that_fails_is_retried_until_it_is_back(tmp_path):
    # The store's folder is a file for a while: every write fails (a store that is down), then works.
    root = tmp_path / "store"
    root.write_text("in the way")
    registry = CollectorRegistry()
    uploader = Uploader(LocalStore(str(tmp_path), mkdir=False), StoreCounters(registry), backoff_s=(0.05, 0.2))
    ups = [_upload(tmp_path, f"store/u{i}") for i in range(3)]
    for up in ups:
        uploader.submit(up)
    await until(lambda: _count(registry, "sidecar_store_upload_retries_total") >= 3)
    assert ups[0].status["state"] == "retrying" and ups[0].status["error"]
    assert [u.status["state"] for u in ups[1:]] == ["pending", "pending"]  # in order, behind the first
    root.unlink()
    await until(lambda: all(u.status["state"] == "stored" for u in ups), timeout=10)
    assert all(u.status["error"] is None for u in ups)
    assert sorted(p.name for p in root.iterdir()) == ["u0", "u1", "u2"]
    assert _count(registry, "sidecar_store_uploads_total", kind="capture", outcome="failed") == 0
    await uploader.close()


async def test_a_refusal_fails_at_once_and_is_not_retried(tmp_path, monkeypatch, caplog):
    calls = []

    async def refuse(store, key, file, **kw):
        calls.append(key)
        raise obstore.exceptions.PermissionDeniedError("403 Forbidden: InvalidAccessKeyId")

    monkeypatch.setattr(obstore, "put_async", refuse)
    registry = CollectorRegistry()
    uploader = Uploader(MemoryStore(), StoreCounters(registry), backoff_s=(0.01, 0.01))
    ups = [_upload(tmp_path, f"r{i}") for i in range(2)]
    for up in ups:
        uploader.submit(up)
    await until(lambda: all(u.status["state"] == "failed" for u in ups))
    await asyncio.sleep(0.1)
    assert calls == ["r0/file.bin", "r1/file.bin"]  # one attempt each
    assert "InvalidAccessKeyId" in ups[0].status["error"]
    assert _count(registry, "sidecar_store_upload_retries_total") == 0
    assert _count(registry, "sidecar_store_uploads_total", kind="capture", outcome="failed") == 2
    assert sum("refused, not retried" in r.message for r in caplog.records) == 1  # named once
    await uploader.close()


async def test_a_full_queue_drops_the_oldest_waiting_never_the_newest(tmp_path):
    root = tmp_path / "store"
    root.write_text("down")
    registry = CollectorRegistry()
    uploader = Uploader(LocalStore(str(tmp_path)), StoreCounters(registry), max_pending=2, backoff_s=(0.05, 0.1))
    ups = [_upload(tmp_path, f"store/q{i}") for i in range(5)]
    uploader.submit(ups[0])
    await until(lambda: ups[0].status["state"] in ("uploading", "retrying"))
    for up in ups[1:]:
        uploader.submit(up)
    # q0 is in flight; of q1..q4 two may wait: q1 and q2 were dropped, q3 and q4 wait.
    assert [u.status["state"] for u in ups[1:]] == ["dropped", "dropped", "pending", "pending"]
    assert "queue was full" in ups[1].status["error"]
    assert _count(registry, "sidecar_store_uploads_total", kind="capture", outcome="dropped") == 2
    assert _count(registry, "sidecar_store_uploads_pending") == 3
    root.unlink()
    await until(lambda: all(u.status["state"] == "stored" for u in (ups[0], ups[3], ups[4])), timeout=10)
    assert sorted(p.name for p in root.iterdir()) == ["q0", "q3", "q4"]
    await uploader.close()


async def test_a_file_removed_before_its_upload_fails_naming_it(tmp_path):
    registry = CollectorRegistry()
    uploader = Uploader(MemoryStore(), StoreCounters(registry))
    up = _upload(tmp_path, "gone")
    up.files[0][1].unlink()
    uploader.submit(up)
    await until(lambda: up.status["state"] == "failed")
    assert "gone.bin was removed from the local disk" in up.status["error"]
    await uploader.close()


# -- a sidecar with stand-in engines ---------------------------------------------------------------------------
async def test_a_capture_is_stored_and_a_new_sidecar_lists_and_serves_it(sidecar, engines, tmp_path):
    shared = tmp_path / "bucket"
    url = f"file://{shared}/team"
    client = await sidecar(store_url=url, store_instance="pod-a")
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20")
    await wait_processes(client, 1)
    started = await client.post("/profile/start", params={"steps": "2", "fleet": "fl-1"})
    assert started.status == 202, await started.text()
    cid = (await started.json())["id"]
    body = await wait_final(client, cid)
    assert body["state"] == "done" and body["fleet"] == "fl-1"
    for _ in range(300):
        body = await (await client.get(f"/profile/{cid}")).json()
        if body["stored"]["state"] == "stored":
            break
        await asyncio.sleep(0.05)
    prefix = shared / "team" / "fleets" / "fl-1" / "pod-a" / cid
    assert body["stored"] == {"url": f"file://{shared}/team/fleets/fl-1/pod-a/{cid}/", "state": "stored", "error": None}
    stored_record = json.loads((prefix / "capture.json").read_text())
    assert stored_record["fleet"] == "fl-1" and stored_record["stored"]["state"] == "stored"
    local_trace = (tmp_path / "traces" / "captures" / cid / "trace.json.gz").read_bytes()
    assert (prefix / "trace.json.gz").read_bytes() == local_trace
    local_record = json.loads((tmp_path / "traces" / "captures" / cid / "capture.json").read_text())
    assert local_record["stored"]["state"] == "stored"  # saved again when the upload ended
    assert "sidecar_store_uploads_total" in await (await client.get("/metrics")).text()

    # A new pod: an empty trace dir, the same store.
    again = await sidecar(store_url=url, store_instance="pod-b", trace_dir=tmp_path / "empty")
    for _ in range(200):
        listed = (await (await again.get("/profiles")).json())["captures"]
        if any(c["id"] == cid for c in listed):
            break
        await asyncio.sleep(0.05)
    assert [c["id"] for c in listed] == [cid]
    assert listed[0]["fleet"] == "fl-1" and listed[0]["steps"] == 2
    trace = await again.get(f"/profile/{cid}/trace")
    assert trace.status == 200
    served = await trace.read()
    assert served == local_trace and json.loads(gzip.decompress(served))["traceEvents"]
    assert (await again.get(f"/profile/{cid}/summary")).status == 200
    # Fetched back, it is a local capture of the new disk, with its record.
    assert json.loads((tmp_path / "empty" / "captures" / cid / "capture.json").read_text())["id"] == cid


async def test_a_scan_a_module_timing_and_a_triggers_recorder_dump_are_stored(sidecar, engines, tmp_path):
    shared = tmp_path / "bucket"
    client = await sidecar(store_url=f"file://{shared}", store_instance="pod-a")
    resp = await client.post("/triggers", json={"metric": "step_duration", "threshold_ms": 300, "cooldown_s": 600,
                                                # No capture: its job would hold the board when the module
                                                # timing starts (a 409, once, when the slow step came then).
                                                "action": {"recorder_seconds": 30, "capture_steps": 0}})
    assert resp.status == 201, await resp.text()
    trigger = (await resp.json())["id"]
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20", "--model", "--slow-step-at", "60",
            "--slow-step-ms", "500")
    await wait_processes(client, 1)

    async def final(path: str) -> dict:
        for _ in range(600):
            body = await (await client.get(path)).json()
            if body["state"] in ("done", "partial", "failed", "cancelled") and body["stored"] and \
                    body["stored"]["state"] in ("stored", "failed", "dropped"):
                return body
            await asyncio.sleep(0.05)
        raise AssertionError(body)

    scan_id = (await (await client.post("/sync/start", params={"steps": "2"})).json())["id"]
    scan = await final(f"/sync/{scan_id}")
    assert scan["stored"] == {"url": f"file://{shared}/scans/{scan_id}.json", "state": "stored", "error": None}
    assert json.loads((shared / "scans" / f"{scan_id}.json").read_text())["sites"] == scan["sites"]
    started = await client.post("/modules/start", params={"steps": "2"})
    assert started.status == 202, await started.text()
    timing = await final(f"/modules/{(await started.json())['id']}")
    job_id = timing["id"]
    assert timing["state"] == "done" and timing["stored"]["state"] == "stored"
    assert json.loads((shared / "modules" / f"{job_id}.json").read_text())["modules"] == timing["modules"]
    for _ in range(300):
        firings = (await (await client.get(f"/triggers/{trigger}")).json())["firings"]
        dumps = list((shared / "recorder" / "pod-a").glob("*.recorder.json.gz")) if firings else []
        if dumps:
            break
        await asyncio.sleep(0.1)
    recorded = Path(next(f["recorder"] for f in firings if f["recorder"]))
    assert [d.name for d in dumps] == [recorded.name]
    await until(lambda: dumps[0].stat().st_size == recorded.stat().st_size)
    assert dumps[0].read_bytes() == recorded.read_bytes()


async def test_retention_waits_for_an_upload_and_removes_local_copies_only(sidecar, engines, tmp_path):
    shared = tmp_path / "bucket"
    client = await sidecar(store_url=f"file://{shared}/team", keep=1, store_backoff_s=(0.05, 0.2))
    (shared / "team").rmdir()
    (shared / "team").write_text("the store is down while this file stands in its way")
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20")
    await wait_processes(client, 1)
    ids = []
    for _ in range(2):
        started = await client.post("/profile/start", params={"steps": "2"})
        ids.append((await started.json())["id"])
        assert (await wait_final(client, ids[-1]))["state"] == "done"
    first_dir = tmp_path / "traces" / "captures" / ids[0]
    # --keep 1 retained the first capture away, but its upload had not ended: its files stay, it stays listed.
    assert first_dir.is_dir()
    listed = [c["id"] for c in (await (await client.get("/profiles")).json())["captures"]]
    assert listed == ids[::-1]
    assert (await client.get(f"/profile/{ids[0]}/trace")).status == 200
    (shared / "team").unlink()  # the store is back
    for _ in range(300):
        states = [(await (await client.get(f"/profile/{c}")).json())["stored"]["state"] for c in ids]
        if states == ["stored", "stored"] and not first_dir.exists():
            break
        await asyncio.sleep(0.05)
    assert states == ["stored", "stored"] and not first_dir.exists()
    # The local copy is gone, the stored one stays listed and is fetched back when asked for.
    listed = [c["id"] for c in (await (await client.get("/profiles")).json())["captures"]]
    assert listed == ids[::-1]
    trace = await client.get(f"/profile/{ids[0]}/trace")
    assert trace.status == 200
    assert await trace.read() == (shared / "team" / "captures" / ids[0] / "trace.json.gz").read_bytes()
