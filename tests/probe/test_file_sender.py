"""A probe sends only its own files, in order, with the whole file's SHA-256 last, then deletes them."""

import base64
import hashlib
import os

from sidecar.probe.file_sender import FileSender
from sidecar.probe.capture.trace_root import TraceRoot
from sidecar.common.protocol import CHUNK_BYTES, Fetch


def test_a_raw_trace_goes_in_chunks_and_is_deleted(tmp_path):
    root = TraceRoot(tmp_path / "root")
    path = root.capture_file("c1", "worker-pid1")
    os.makedirs(os.path.dirname(path))
    content = os.urandom(CHUNK_BYTES * 2 + 17)
    with open(path, "wb") as f:
        f.write(content)
    sender, got, offset = FileSender(root), b"", 0
    while True:
        chunk = sender.answer(Fetch(file=path, offset=offset))
        assert chunk.error is None and chunk.size == len(content)
        data = base64.b64decode(chunk.data)
        got, offset = got + data, offset + len(data)
        if chunk.sha256:
            break
        assert os.path.exists(path)
    assert got == content and chunk.sha256 == hashlib.sha256(content).hexdigest()
    assert not os.path.exists(path) and not os.path.exists(os.path.dirname(path)), "file and empty folders gone"


def test_nothing_outside_the_probes_own_folders_is_sent(tmp_path):
    root = TraceRoot(tmp_path / "root")
    secret = tmp_path / "root" / "token.json"
    secret.parent.mkdir(parents=True)
    secret.write_text("{}")
    outside = tmp_path / "elsewhere.json"
    outside.write_text("{}")
    sender = FileSender(root)
    for name in (str(secret), str(outside), str(tmp_path / "root" / "captures" / ".." / ".." / "elsewhere.json"),
                 "/etc/passwd"):
        chunk = sender.answer(Fetch(file=name))
        assert chunk.error and "not a file this probe wrote" in chunk.error and not chunk.data, name
    assert secret.exists() and outside.exists()


def test_a_fetch_out_of_order_or_of_a_missing_file_is_an_error(tmp_path):
    root = TraceRoot(tmp_path / "root")
    path = root.recorder_file(3, "worker-pid1")
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(b"x" * (CHUNK_BYTES + 1))
    sender = FileSender(root)
    assert "out of order" in sender.answer(Fetch(file=path, offset=CHUNK_BYTES)).error
    assert sender.answer(Fetch(file=path, offset=0)).sha256 is None
    assert sender.answer(Fetch(file=path, offset=CHUNK_BYTES)).sha256 is not None
    assert not os.path.exists(path)
    assert sender.answer(Fetch(file=path, offset=0)).error  # gone: said, not raised


def test_a_marker_names_this_process_and_stale_ones_go(tmp_path):
    root = TraceRoot(tmp_path / "root")
    (tmp_path / "root" / "probes").mkdir(parents=True)
    stale = tmp_path / "root" / "probes" / f"{2**22 + 5}-{'0' * 32}"  # above any pid: not alive
    stale.touch()
    name = root.make_marker()
    assert name.startswith(f"{os.getpid()}-") and (tmp_path / "root" / "probes" / name).is_file()
    assert not stale.exists()
    root.remove_marker(name)
    assert not (tmp_path / "root" / "probes" / name).exists()
