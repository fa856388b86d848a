"""Files read back from the trace dir: which names of a capture's folder are the sidecar's, and
opening a file so that it is surely the one at that name in that folder (issue 27).

The trace dir outlives the sidecar, and whoever can write into it (the sidecar's own user, anyone
sharing a trace volume, a ``./traces`` made group-writable by a umask) could plant a
``capture.json`` naming ``/etc/passwd`` or ``../../x``, or put a symbolic link where a trace lies.
So a name read back from disk is taken only if it is one the sidecar itself writes: a process's
``<stem>.pt.trace.json.gz`` (the stem as process_stems.py makes it, the suffix as
compression.py writes it: the pattern is built from both, so writer and checker cannot
drift), the merged ``trace.json.gz`` or ``summary.json``; never a path. And a file is opened
relative to its folder's descriptor with ``O_NOFOLLOW`` on both (a link is never followed), then
checked to be a regular file that is the very inode at that name in the folder's real path. A saved
job's JSON (sidecar/service/jobs/saved.py) is opened the same way, its own name not followed if it is a link.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from .merge import MERGED_NAME, PROCESS_TRACE_SUFFIX, SUMMARY_NAME
from .process_stems import WRITTEN_STEM

_PROCESS_FILE = re.compile(WRITTEN_STEM.pattern + re.escape(PROCESS_TRACE_SUFFIX))
# What open(2) answers when O_NOFOLLOW meets a link (Linux: ELOOP; FreeBSD: EMLINK), or when a path
# component that should be a folder is not one.
_NOT_FOLLOWED = {errno.ELOOP, errno.EMLINK, errno.ENOTDIR}
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class NotInFolder(Exception):
    """What a name leads to is not a regular file of the folder itself (a link, a folder, a FIFO,
    a name the sidecar does not write): it is never read nor served."""


def is_process_file_name(name: object) -> bool:
    """Whether ``name`` is a process's trace file as the export names it (``merge.finalize_capture``)."""
    return isinstance(name, str) and _PROCESS_FILE.fullmatch(name) is not None


def is_capture_file_name(name: object) -> bool:
    """Whether ``name`` is any file a capture serves: a process's trace, the merged trace, the summary."""
    return is_process_file_name(name) or name in (MERGED_NAME, SUMMARY_NAME)


def not_a_plain_file(folder: Path, name: str) -> str | None:
    """Why ``name`` in ``folder`` is not a regular file of its own (a symbolic link, a folder...);
    None when it is one, or is not there at all (removed: answered 410 when asked for)."""
    try:
        mode = os.lstat(folder / name).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return None if stat.S_ISREG(mode) else "not a regular file"


def open_capture_file(folder: Path, name: str) -> BinaryIO:
    """A capture's file ``name`` in ``folder`` (its own folder), open for reading: only a name the
    sidecar writes, never through a link. Raises NotInFolder, FileNotFoundError (it or the folder is
    gone) or another OSError."""
    if not is_capture_file_name(name):
        raise NotInFolder(f"{name!r} is not a name the sidecar writes")
    return open_in_folder(folder, name)


def open_in_folder(folder: Path, name: str) -> BinaryIO:
    """``name`` (one path component) in ``folder``, open for reading, if it is a regular file of the
    folder itself: neither the folder's last component nor the file is followed if it is a link
    (``O_NOFOLLOW``), and what was opened is checked to be the inode at ``name`` in the folder's real
    path. Raises NotInFolder, FileNotFoundError or another OSError."""
    if not name or name in (os.curdir, os.pardir) or os.sep in name or (os.altsep and os.altsep in name):
        raise NotInFolder(f"{name!r} is not a file name")
    dir_fd = _open_not_following(folder, os.O_DIRECTORY)
    try:
        file = open_regular_file(name, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    try:
        _check_is_the_file_there(file.fileno(), folder, name)
    except BaseException:
        file.close()
        raise
    return file


def open_regular_file(path: Path | str, *, dir_fd: int | None = None) -> BinaryIO:
    """``path`` open for reading if it is a regular file, its last component not followed if it is a
    link (a saved job's JSON: the folders above it are the user's to place). Raises NotInFolder,
    FileNotFoundError or another OSError."""
    # O_NONBLOCK: a FIFO planted under a file's name must not hang the open (it is refused below).
    fd = _open_not_following(path, os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotInFolder(f"{path}: not a regular file")
        return open(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def _open_not_following(path: Path | str, flags: int, dir_fd: int | None = None) -> int:
    try:
        return os.open(path, _READ_FLAGS | flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in _NOT_FOLLOWED:
            raise NotInFolder(f"{path}: a symbolic link or not a folder: not followed") from None
        raise


def _check_is_the_file_there(fd: int, folder: Path, name: str) -> None:
    opened = os.fstat(fd)
    real_folder = os.path.realpath(folder)
    real = os.path.realpath(os.path.join(real_folder, name))
    if os.path.dirname(real) != real_folder:
        raise NotInFolder(f"{name}: resolves outside {real_folder}")
    there = os.stat(real, follow_symlinks=False)  # FileNotFoundError: removed since it was opened
    if (there.st_dev, there.st_ino) != (opened.st_dev, opened.st_ino):
        raise NotInFolder(f"{name}: replaced while it was opened")
