"""Object storage against an S3-compatible server running as its own process (moto's standalone
server, installed by scripts/install-test-backends.sh into .venv/moto), with a sidecar and a stand-in
engine: the store down for a minute and back (uploads retried, nothing lost, serving untouched, the
queue bounded), refused credentials (failed once with the store's reason, never retried), a full
queue (the oldest waiting upload dropped and counted), and a sidecar on an empty disk that lists and
serves what its predecessor stored."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store

from test_service import engines, sidecar, wait_final, wait_processes  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[1]
MOTO = ROOT / ".venv" / "moto" / "bin" / "moto_server"
STORE_DOWN_S = 60.0  # the outage: a minute
BUCKET = "captures-bucket"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    """One moto_server process on a fixed port, stopped and started again at will (its data is in memory:
    a restart is an empty store, as a store recreated by its operator)."""

    def __init__(self, port: int, env: dict[str, str] | None = None) -> None:
        assert MOTO.exists(), f"{MOTO} is missing: run scripts/install-test-backends.sh (it installs moto[server])"
        self.port, self.env, self.proc = port, env or {}, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self, bucket: bool = True) -> None:
        import os

        self.proc = subprocess.Popen([str(MOTO), "-H", "127.0.0.1", "-p", str(self.port)], env={**os.environ, **self.env},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=2).read()
                break
            except OSError:
                assert self.proc.poll() is None, "moto_server exited"
                assert time.monotonic() < deadline, "moto_server did not answer in 60 s"
                time.sleep(0.2)
        if bucket:
            urllib.request.urlopen(urllib.request.Request(f"{self.url}/{BUCKET}", method="PUT"), timeout=10).read()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def keys(self, prefix: str = "") -> list[str]:
        store = S3Store(BUCKET, endpoint=self.url, region="us-east-1", access_key_id="test", secret_access_key="test",
                        client_options={"allow_http": True})
        return sorted(m["path"] for batch in obstore.list(store, prefix=prefix or None) for m in batch)


@pytest.fixture
def moto(monkeypatch):
    servers = []

    def make(env: dict[str, str] | None = None) -> Moto:
        server = Moto(_free_port(), env)
        servers.append(server)
        monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)  # the standard variable, read by the store's library
        return server

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    yield make
    for server in servers:
        server.stop()


async def _capture(client, steps: int = 2) -> str:
    started = await client.post("/profile/start", params={"steps": str(steps)})
    assert started.status == 202, await started.text()
    cid = (await started.json())["id"]
    assert (await wait_final(client, cid))["state"] == "done"
    return cid


async def _stored(client, cid: str, states: tuple[str, ...], timeout: float = 60) -> dict:
    for _ in range(int(timeout * 10)):
        stored = (await (await client.get(f"/profile/{cid}")).json())["stored"]
        if stored["state"] in states:
            return stored
        await asyncio.sleep(0.1)
    raise AssertionError(f"capture {cid}: stored is {stored}, not one of {states}")


def _metric(text: str, sample: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(sample))


async def test_the_store_down_for_a_minute_loses_nothing_and_a_new_sidecar_serves_it(sidecar, engines, moto, tmp_path):
    server = moto()
    server.start()
    url = f"s3://{BUCKET}/prod"
    client = await sidecar(store_url=url, store_instance="pod-a", store_backoff_s=(0.2, 2.0))
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20")
    await wait_processes(client, 1)
    first = await _capture(client)
    assert (await _stored(client, first, ("stored", "failed")))["state"] == "stored"

    server.stop()  # the store is down
    down_at = time.monotonic()
    during = [await _capture(client), await _capture(client)]
    assert (await _stored(client, during[0], ("retrying",)))["error"]
    # Serving goes on: health, listings and the captures' files come from the local disk.
    while time.monotonic() - down_at < STORE_DOWN_S:
        assert (await client.get("/healthz")).status == 200
        trace = await client.get(f"/profile/{during[0]}/trace")
        assert trace.status == 200 and len(await trace.read()) > 0
        metrics = await (await client.get("/metrics")).text()
        assert _metric(metrics, "sidecar_store_uploads_pending") <= 64 + 1  # the queue's bound and the one in flight
        await asyncio.sleep(2)
    assert _metric(metrics, "sidecar_store_upload_retries_total") >= 3
    states = [(await (await client.get(f"/profile/{c}")).json())["stored"]["state"] for c in during]
    assert states[0] == "retrying" and states[1] == "pending"

    server.start()  # back (an empty bucket: moto keeps its data in memory)
    for cid in during:
        stored = await _stored(client, cid, ("stored", "failed", "dropped"))
        assert stored == {"url": f"{url}/captures/{cid}/", "state": "stored", "error": None}
    keys = server.keys("prod/captures/")
    for cid in during:
        assert f"prod/captures/{cid}/capture.json" in keys and f"prod/captures/{cid}/trace.json.gz" in keys
    metrics = await (await client.get("/metrics")).text()
    assert _metric(metrics, 'sidecar_store_uploads_total{kind="capture",outcome="dropped"}') == 0
    assert _metric(metrics, 'sidecar_store_uploads_total{kind="capture",outcome="failed"}') == 0

    # A new pod: an empty disk, the same store: it lists the stored captures and serves their traces.
    local = (tmp_path / "traces" / "captures" / during[1] / "trace.json.gz").read_bytes()
    again = await sidecar(store_url=url, store_instance="pod-b", trace_dir=tmp_path / "new-pod")
    for _ in range(300):
        listed = {c["id"] for c in (await (await again.get("/profiles")).json())["captures"]}
        if set(during) <= listed:
            break
        await asyncio.sleep(0.1)
    assert set(during) <= listed
    trace = await again.get(f"/profile/{during[1]}/trace")
    assert trace.status == 200 and await trace.read() == local


async def test_refused_credentials_fail_once_with_the_reason_and_are_not_retried(sidecar, engines, moto):
    server = moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})  # moto checks every request's access key
    server.start(bucket=False)
    client = await sidecar(store_url=f"s3://{BUCKET}/prod", store_backoff_s=(0.1, 0.2))
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20")
    await wait_processes(client, 1)
    cid = await _capture(client)
    stored = await _stored(client, cid, ("stored", "failed"))
    assert stored["state"] == "failed"
    assert "PermissionDenied" in stored["error"] and "InvalidAccessKeyId" in stored["error"]
    assert "test" not in stored["error"].replace("/captures", "")  # the key id is never named back
    await asyncio.sleep(2)  # time for several backoffs: none happens
    metrics = await (await client.get("/metrics")).text()
    assert _metric(metrics, "sidecar_store_upload_retries_total") == 0
    assert _metric(metrics, 'sidecar_store_uploads_total{kind="capture",outcome="failed"}') == 1
    assert (await (await client.get(f"/profile/{cid}")).json())["stored"] == stored


async def test_a_full_queue_drops_the_oldest_waiting_upload(sidecar, engines, moto):
    server = moto()  # never started: the store is down throughout
    client = await sidecar(store_url=f"s3://{BUCKET}/prod", store_queue=1, store_backoff_s=(0.5, 1.0))
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20")
    await wait_processes(client, 1)
    ids = [await _capture(client) for _ in range(3)]
    states = [(await (await client.get(f"/profile/{c}")).json())["stored"] for c in ids]
    assert states[0]["state"] in ("uploading", "retrying")  # in flight
    assert states[1]["state"] == "dropped" and "queue was full" in states[1]["error"]
    assert states[2]["state"] == "pending"  # the newest is kept
    metrics = await (await client.get("/metrics")).text()
    assert _metric(metrics, 'sidecar_store_uploads_total{kind="capture",outcome="dropped"}') == 1
    server.start()
    assert (await _stored(client, ids[2], ("stored", "failed")))["state"] == "stored"
    assert f"prod/captures/{ids[1]}/capture.json" not in server.keys("prod/")
