"""Issue 27, B: a file fetched from a probe is cut off as soon as its bytes pass the size the probe
declared or the capture limit. A lying probe (declares 10 bytes, sends 6 MiB against a 2 MiB limit)
gets its fetch failed at the first chunk too many: nothing beyond the limit (plus the one chunk in
hand) is ever written, the partial file is deleted and the capture says why that process failed."""

import asyncio
import base64
import dataclasses
import hashlib

import pytest

from sidecar.common.protocol import CHUNK_BYTES, CaptureReport, Fetch, FileChunk
from sidecar.service.channel import file_fetch
from sidecar.service.app import make_app
from sidecar.service.routes.keys import JOBS, REGISTRY
from sidecar.common.verdicts import FINAL

from service_fakes import FakeWebSocket, identity
from test_file_fetch import Conn
from test_restart_index import settings

MiB = 1 << 20
LIMIT = 2 * MiB


class LyingProbe:
    """Answers each fetch (as ``FileSender.answer`` would) with chunks of a file of ``sends`` bytes
    while claiming ``declared`` (a list: the claim of each chunk in turn, the last one repeated).
    It notes every offset asked for and, where ``watch`` is set, that file's size at each ask: what
    the sidecar had written by then."""

    def __init__(self, declared, sends, watch=None):
        self.declared, self.sends, self.watch = list(declared), sends, watch
        self.asked, self.sizes_seen = [], []
        self._digest = hashlib.sha256()

    def answer(self, fetch):
        self.asked.append(fetch.offset)
        for path in self.watch() if self.watch else ():
            self.sizes_seen.append(path.stat().st_size)
        data = b"x" * min(CHUNK_BYTES, self.sends - fetch.offset)
        self._digest.update(data)
        last = fetch.offset + len(data) >= self.sends
        claim = self.declared[min(len(self.asked), len(self.declared)) - 1]
        return FileChunk(file=fetch.file, offset=fetch.offset, size=claim, data=base64.b64encode(data).decode(),
                         sha256=self._digest.hexdigest() if last else None)

    def most_written(self):
        """The most the sidecar can have written: what it had when it last asked, plus that chunk."""
        return max(self.asked) + CHUNK_BYTES


@pytest.mark.parametrize("declared, problem", [
    ([10], "more bytes than the 10 declared"),
    ([MiB + 3], f"more bytes than the {MiB + 3} declared"),
    ([0], "more bytes than the 0 declared"),
    ([CHUNK_BYTES, LIMIT - 1], "declared size changed"),  # a claim raised as the bytes come
])
async def test_a_probe_sending_past_its_declared_size_is_cut_off(tmp_path, declared, problem):
    target = tmp_path / "sidecar" / "raw" / "worker.json"
    probe = LyingProbe(declared, 6 * MiB, watch=lambda: [target] if target.exists() else [])
    with pytest.raises(file_fetch.FetchError) as failed:
        await file_fetch.fetch_file(Conn(probe), "/remote/worker.json", target, LIMIT, timeout_s=5)
    assert probe.most_written() <= LIMIT + CHUNK_BYTES, f"asked up to byte {max(probe.asked)}"
    assert max(probe.sizes_seen, default=0) <= min(declared[0], LIMIT), probe.sizes_seen
    assert problem in str(failed.value)
    assert not target.exists(), "the partial file is deleted"


async def test_a_recorder_dump_past_its_declared_size_is_cut_off_in_memory(tmp_path):
    probe = LyingProbe([10], 6 * MiB)
    with pytest.raises(file_fetch.FetchError) as failed:
        await file_fetch.fetch_bytes(Conn(probe), "/remote/recorder/dump.json", LIMIT, timeout_s=5)
    assert probe.asked == [0], "not one chunk past the first"
    assert "more bytes than the 10 declared" in str(failed.value)


class RemoteProbeSocket(FakeWebSocket):
    """The websocket of a probe on another host: each ``fetch`` the sidecar sends is answered by ``probe``."""

    def __init__(self, probe):
        super().__init__()
        self.probe, self.conn = probe, None

    async def send_str(self, text):
        await super().send_str(text)
        message = self.sent[-1]
        if isinstance(message, Fetch):
            asyncio.get_running_loop().call_soon(file_fetch.on_chunk, self.conn, self.probe.answer(message))


async def test_a_capture_fails_the_process_whose_probe_sends_too_much(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    app = make_app(dataclasses.replace(settings(tmp_path), max_capture_bytes=LIMIT))
    client = await aiohttp_client(app)
    probe = LyingProbe([10], 6 * MiB, watch=lambda: list(trace_dir.glob("captures/*/raw/*")))
    ws = RemoteProbeSocket(probe)
    conn = ws.conn = app[REGISTRY].add(identity("worker", 0), ws, shares_files=False)

    start = await client.post("/profile/start?steps=1")
    assert start.status == 202, await start.text()
    capture_id = (await start.json())["id"]
    board = app[JOBS]
    remote = f"/other-host/traces/captures/{capture_id}/raw/{conn.identity.probe_file_stem}.json"
    reports = (("armed", {"steps_seen": 0}), ("capturing", {"first_step": 2}), ("exporting", {"steps_recorded": 1}),
               ("done", {"steps_recorded": 1, "file": remote, "bytes": 10}))
    for state, fields in reports:
        await board.on_report(conn, CaptureReport(job_id=capture_id, state=state, **fields))
    for _ in range(500):
        body = await (await client.get(f"/profile/{capture_id}")).json()
        if body["state"] in FINAL:
            break
        await asyncio.sleep(0.01)

    assert probe.most_written() <= LIMIT + CHUNK_BYTES, f"asked up to byte {max(probe.asked)}"
    assert max(probe.sizes_seen, default=0) <= LIMIT, probe.sizes_seen
    [process] = body["processes"]
    assert process["state"] == "failed", body
    assert "trace not received" in process["error"] and "more bytes than the 10 declared" in process["error"], process
    assert process["file"] is None and body["files"] == {}
    assert list(trace_dir.glob(f"captures/{capture_id}/raw/*")) == [], "the partial file is deleted"
