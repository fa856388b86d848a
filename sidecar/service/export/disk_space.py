"""The sidecar and a full disk: refuse to arm without room, say "no space left on device" when a
write fails for it, and never leave a partial file (or an open one) behind.

A full disk shows up late and in disguise: a probe's export that ran out of space leaves a cut-short
or empty JSON file, which the merge would call "unreadable trace: Expecting value". So the verdict
names the disk whenever the write failed with ENOSPC, or the trace dir has (almost) no room left.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

from ...common import config

log = logging.getLogger(__name__)

NO_SPACE = "no space left on device"
# Below this much free space on the trace dir a capture is refused (``sidecar serve --min-free-mb``):
# a few steps of one process already write tens of MiB of plain JSON, and the sidecar needs room for
# the gzip and the merge.
MIN_FREE_BYTES = config.DEFAULT_MIN_FREE_MB << 20
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(Exception):
    """The trace dir has too little free space to start a capture (HTTP 507)."""


def is_disk_full_error(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _FULL_ERRNOS


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` (None when it cannot be asked)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def low_on_space(path: Path, floor: int = MIN_FREE_BYTES) -> bool:
    free = free_bytes(path)
    return free is not None and free < floor


def ensure_room(path: Path, floor: int = MIN_FREE_BYTES) -> None:
    """Raise ``DiskFull`` when ``path``'s file system has less than ``floor`` bytes free."""
    free = free_bytes(path)
    if free is not None and free < floor:
        raise DiskFull(f"{NO_SPACE}: {free // 2**20} MiB free on {path}, a capture needs at least "
                       f"{floor // 2**20} MiB")


def describe(exc: BaseException) -> str:
    """An error's text for a verdict; a full disk is named as such, whatever path it hit."""
    if is_disk_full_error(exc):
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        return f"{NO_SPACE}{where}"
    return str(exc)


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all: through ``<name>.tmp`` and ``os.replace``. On failure the
    temporary file is closed and deleted (a full disk must not stay full of half-written files)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def unlink_quietly(*paths: Path) -> None:
    for path in paths:
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("cannot delete %s: %s", path, exc)


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (0 for a path that is gone); links are not followed."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                total += tree_bytes(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total
