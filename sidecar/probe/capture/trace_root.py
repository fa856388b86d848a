"""Where a probe writes: only under the trace root it was configured with, never where a message says.

A capture's raw trace is ``<root>/captures/<job id>/raw/<process file stem>.json``. The job id cannot
be a path component (``protocol.JobId``), the file stem is the probe's own, and the path is checked
once more here: resolved, it must be that very path under the resolved root (no symbolic link below
the root leads elsewhere). The root is ``$SIDECAR_TRACE_DIR``, else ``traces`` beside the default
token file (``config.trace_dir``); a missing root (and its folder) is created private (0700). The
sidecar reads the file from the path the probe reports, and deletes it with its folders once
compressed.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import time
from pathlib import Path

from ...common.protocol import JOB_ID_PATTERN, PROBE_MARKERS_DIR, RECORDER_DIR, recorder_dump_name
from .marker import MAX_AGE_S, MarkerName

CAPTURES = "captures"
RAW = "raw"
PROBES = PROBE_MARKERS_DIR  # <root>/probes/<marker name>: one empty marker per probe, for the sidecar to look for
NO_SPACE = "no space left on device"
# After an export, less free space than this on the trace's file system means the write hit the
# wall: Kineto's writer does not raise on a full disk, it leaves a cut-short or empty file.
FULL_BELOW_BYTES = 1 << 20
# Temporary files beside a raw trace: Kineto's.
_TEMP_SUFFIXES = (".tmp",)


class TraceRoot:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def capture_file(self, job_id: str, stem: str) -> str:
        """The raw trace file of capture ``job_id`` in this process (not created). Raises ValueError
        when it would not lie under the root, OSError when the root cannot be created."""
        if not re.match(JOB_ID_PATTERN, job_id):  # the protocol's own check, once more
            raise ValueError(f"{job_id!r} is not a job id")
        return self._under_root(f"the trace file of capture {job_id}", stem, CAPTURES, job_id, RAW, stem + ".json")

    def recorder_file(self, query_id: int, stem: str, packed: bool = False) -> str:
        """Where this process writes its flight recorder's dump for query ``query_id`` (not created):
        ``<root>/recorder/<stem>-q<id>.json`` (``.msgpack``: packed rows). The sidecar reads it and
        deletes it."""
        return self._under_root("the recorder dump", stem, RECORDER_DIR, recorder_dump_name(stem, query_id, packed))

    def make_marker(self, mine: MarkerName | None = None) -> str:
        """Create this process's marker file, ``<root>/probes/<mine.name>`` (marker.py; None: this
        process's, with the host's name), and return its name. The sidecar looks for it
        (``hello.marker``): where it sees it, the two share this file system and the sidecar reads
        the probe's files itself; else it fetches them over the channel.
        Stale markers are removed first: those of ``mine``'s pid space whose process is gone, and any
        older than ``marker.MAX_AGE_S`` (a probe in another container or on another host: its pid
        says nothing here). Raises OSError."""
        if mine is None:
            mine = MarkerName.for_this_process(socket.gethostname())
        folder = self._markers_folder()
        now = time.time()
        for old in folder.iterdir():
            other = MarkerName.parse(old.name)
            if other is None:
                continue
            if other.pid_is_mine_to_check(mine) and not _alive(other.pid):
                old.unlink(missing_ok=True)
                continue
            try:
                if now - old.stat().st_mtime > MAX_AGE_S:
                    old.unlink(missing_ok=True)
            except OSError:  # another probe removed it meanwhile
                pass
        (folder / mine.name).touch(mode=0o600)
        return mine.name

    def refresh_marker(self, name: str) -> None:
        """Touch this probe's marker, making it again if it was removed: called before each
        connection's hello, so the marker the sidecar looks for is there and young (only a marker
        left behind grows old enough to be cleared by age)."""
        try:
            (self._markers_folder() / name).touch(mode=0o600)
        except (OSError, ValueError):  # the sidecar will fetch this probe's files
            pass

    def remove_marker(self, name: str) -> None:
        try:
            (self.path / PROBES / name).unlink()
        except OSError:
            pass

    def _markers_folder(self) -> Path:
        folder = Path(self._under_root("the probe markers", PROBES, PROBES))
        folder.mkdir(mode=0o700, exist_ok=True)
        return folder

    def _under_root(self, what: str, stem: str, *parts: str) -> str:
        if os.sep in stem or stem in ("", ".", ".."):
            raise ValueError(f"{stem!r} is not a file name")
        if not self.path.is_dir():  # private when this probe creates it (and its folder, as the token's is)
            os.makedirs(self.path.parent, mode=0o700, exist_ok=True)
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        root = os.path.realpath(self.path)
        path = os.path.join(root, *parts)
        if os.path.realpath(path) != path:
            raise ValueError(f"{what} would resolve outside this process's trace root "
                             f"{self.path} (a symbolic link in it?)")
        return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # alive, another user's
        return True
    return True


def is_disk_full(error: BaseException | None) -> bool:
    """``error`` is a write that failed for want of space (ENOSPC, or a quota)."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def export_problem(error: BaseException | None, path: str) -> str | None:
    """Why the export to ``path`` failed, naming a full disk (ENOSPC, a quota, or almost no room
    left where the file lies); None when ``error`` is None and the file is not empty."""
    full = is_disk_full(error)
    try:
        full = full or shutil.disk_usage(os.path.dirname(path)).free < FULL_BELOW_BYTES
    except OSError:
        pass
    if error is None:
        try:
            if os.path.getsize(path) > 0:  # cut short or not, the sidecar's check of the JSON tells
                return None
            what = "the exported trace is empty (0 bytes)"
        except FileNotFoundError:
            # Kineto writes <path>.tmp and renames it only when every write went through: a write
            # that failed (a full disk, typically) leaves the temporary file and no trace.
            what = "the trace was not written" + (
                " (the writer left its temporary file)" if os.path.exists(path + ".tmp") else "")
        except OSError as exc:
            return f"trace export failed: {exc}"
        return f"{NO_SPACE} ({os.path.dirname(path)}): {what}" if full else f"trace export failed: {what}"
    return f"trace export failed: {NO_SPACE} ({os.path.dirname(path)})" if full else f"trace export failed: {error}"


def release(prof) -> None:
    """Let go of what a stopped torch.profiler holds, now. Kineto keeps the temporary file of an
    export that failed (a full disk) open for as long as the profiler's results live, and a
    ``torch.profiler.profile`` sits in reference cycles (its action table holds its own bound
    methods) that only the cyclic garbage collector frees, possibly minutes later: until then a
    deleted file keeps its space and the events their memory. Verified with torch 2.13: the file's
    descriptor closes when ``kineto_results`` is dropped."""
    inner = getattr(prof, "profiler", None)  # torch.autograd.profiler.profile
    if inner is not None and hasattr(inner, "kineto_results"):
        inner.kineto_results = None


def discard(path: str) -> None:
    """Delete a raw trace, the temporary files a failed export left beside it, and its ``raw/`` and
    ``<id>/`` folders when they are left empty."""
    for name in (path, *(path + suffix for suffix in _TEMP_SUFFIXES)):
        try:
            os.unlink(name)
        except OSError:
            pass
    folder = os.path.dirname(path)
    for _ in range(2):
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)
