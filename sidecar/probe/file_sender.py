"""Files a probe sends over the channel, for a sidecar that cannot read its disk (issue 14).

A probe on another host (or in another container without a shared volume) writes its raw traces,
sampled stacks and recorder dumps under its own trace root as always; the sidecar, which sees no
marker of this probe's root (``TraceRoot.make_marker``), asks for them with ``fetch``, one chunk at
a time, and the link thread answers each with a ``file_chunk``. One chunk in flight per file is the
back-pressure: the probe never reads ahead, never queues more than one chunk, and reads at most
``CHUNK_BYTES`` (about 2 ms of the GIL on a 2-core host: base64 and the hash hold it) per answer.

Only a file under this probe's own root, in a folder the probe writes to (``captures/<id>/raw/``,
``recorder/``), is ever sent: an authenticated sidecar still cannot read anything else of the
engine's disk. The SHA-256 of the whole file goes with its last chunk (computed as the chunks are
read, in order; a fetch that starts over restarts it), and then the file is deleted, as the sidecar
deletes a file it read itself.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os

from ..common.protocol import CHUNK_BYTES, RECORDER_DIR, Fetch, FileChunk
from .capture import trace_root as roots

log = logging.getLogger(__name__)

_SENDABLE_SUFFIXES = (".json", ".msgpack", ".pickle")  # .pickle: a memory snapshot's raw file


class FileSender:
    def __init__(self, root: roots.TraceRoot) -> None:
        self._root = root
        self._hashes: dict[str, "hashlib._Hash"] = {}  # file -> the hash of the chunks sent so far, in order

    def answer(self, fetch: Fetch) -> FileChunk:
        """The chunk ``fetch`` asks for, or why there is none (never raises)."""
        try:
            path = self._sendable(fetch.file)
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(fetch.offset)
                data = f.read(CHUNK_BYTES)
        except (OSError, ValueError) as exc:
            self._hashes.pop(fetch.file, None)
            return FileChunk(file=fetch.file, offset=fetch.offset, error=str(exc)[:512])
        digest = self._hashes.pop(fetch.file, None) if fetch.offset else None
        if fetch.offset and digest is None:  # not the next chunk of a fetch in order: start again
            return FileChunk(file=fetch.file, offset=fetch.offset, error="fetch out of order: start at offset 0")
        digest = digest or hashlib.sha256()
        digest.update(data)
        last = fetch.offset + len(data) >= size
        chunk = FileChunk(file=fetch.file, offset=fetch.offset, size=size, data=base64.b64encode(data).decode(),
                          sha256=digest.hexdigest() if last else None)
        if last:
            self._delete(path)
        else:
            self._hashes[fetch.file] = digest
        return chunk

    def _sendable(self, reported: str) -> str:
        """``reported`` resolved, if it is a file this probe writes; ValueError otherwise."""
        root = os.path.realpath(self._root.path)
        path = os.path.realpath(reported)
        inside = os.path.relpath(path, root).split(os.sep)
        ours = (len(inside) == 4 and inside[0] == roots.CAPTURES and inside[2] == roots.RAW) or (
            len(inside) == 2 and inside[0] == RECORDER_DIR)
        if inside[0] == os.pardir or not ours or not path.endswith(_SENDABLE_SUFFIXES):
            raise ValueError(f"{reported!r} is not a file this probe wrote")
        return path

    @staticmethod
    def _delete(path: str) -> None:
        if os.path.basename(os.path.dirname(path)) == roots.RAW:
            roots.discard(path)  # and the capture's folders once empty
        else:
            try:
                os.unlink(path)
            except OSError as exc:
                log.debug("inference-sidecar: %s not deleted after sending: %s", path, exc)
