"""Fetching a file from a probe over the channel (sidecar/service/channel/file_fetch.py) against the real
sender (sidecar/probe/file_sender.py): whole and checked, or a FetchError and no partial file."""

import asyncio
import hashlib
import os
from msgspec.structs import replace

import pytest

from sidecar.probe.file_sender import FileSender
from sidecar.probe.capture.trace_root import TraceRoot
from sidecar.common.protocol import CHUNK_BYTES
from sidecar.service.channel import file_fetch


class Conn:
    """A connection whose probe answers each fetch through ``sender`` (``tamper`` may change a chunk)."""

    def __init__(self, sender, tamper=None, reachable=True):
        self.chunk_waiters, self.sender, self.tamper, self.reachable = {}, sender, tamper, reachable

    async def send(self, fetch):
        if not self.reachable:
            return False
        chunk = self.sender.answer(fetch)
        if self.tamper is not None:
            chunk = self.tamper(chunk)
        if chunk is not None:
            asyncio.get_running_loop().call_soon(file_fetch.on_chunk, self, chunk)
        return True


def a_trace(tmp_path, size):
    root = TraceRoot(tmp_path / "probe")
    path = root.capture_file("c1", "worker-pid9")
    os.makedirs(os.path.dirname(path))
    content = os.urandom(size)
    with open(path, "wb") as f:
        f.write(content)
    return FileSender(root), path, content


async def test_a_file_arrives_whole(tmp_path):
    sender, path, content = a_trace(tmp_path, CHUNK_BYTES * 3 + 5)
    target = tmp_path / "sidecar" / "raw" / "worker.json"
    assert await file_fetch.fetch_file(Conn(sender), path, target, 1 << 30) == len(content)
    assert target.read_bytes() == content


async def test_an_empty_file_arrives_empty(tmp_path):
    sender, path, _ = a_trace(tmp_path, 0)
    assert await file_fetch.fetch_bytes(Conn(sender), path, 1 << 20) == b""


@pytest.mark.parametrize("tamper, problem", [
    (lambda c: replace(c, sha256=hashlib.sha256(b"other").hexdigest()) if c.sha256 else c, "checksum mismatch"),
    (lambda c: replace(c, size=c.size + 1), "received"),
    (lambda c: None, "no answer within"),
])
async def test_a_damaged_or_missing_transfer_fails_and_leaves_nothing(tmp_path, tamper, problem):
    sender, path, _ = a_trace(tmp_path, CHUNK_BYTES + 10)
    target = tmp_path / "sidecar" / "raw" / "worker.json"
    with pytest.raises(file_fetch.FetchError, match=problem):
        await file_fetch.fetch_file(Conn(sender, tamper), path, target, 1 << 30, timeout_s=0.2)
    assert not target.exists()


async def test_too_large_unreachable_and_gone(tmp_path):
    sender, path, _ = a_trace(tmp_path, 2048)
    with pytest.raises(file_fetch.FetchError, match="over the limit"):
        await file_fetch.fetch_bytes(Conn(sender), path, 1024)
    with pytest.raises(file_fetch.FetchError, match="unreachable"):
        await file_fetch.fetch_bytes(Conn(sender, reachable=False), path, 1 << 20)
    silent = Conn(sender, tamper=lambda c: None)
    task = asyncio.ensure_future(file_fetch.fetch_bytes(silent, path, 1 << 20))
    await asyncio.sleep(0.05)
    file_fetch.fail_all(silent, "the process disconnected")
    with pytest.raises(file_fetch.FetchError, match="disconnected"):
        await task
    assert silent.chunk_waiters == {}
