"""A capture's raw files: which of the paths the probes reported are this capture's, reading a
process's samples file, why a raw trace cannot be used, and removing them once used.

A probe reports the paths it wrote (``<its trace root>/captures/<id>/raw/<process>.json`` and
``<process>.stacks.msgpack``); the sidecar reads or deletes only a file that has the capture's own
shape of path, never whatever a report names. A samples file that is missing or unreadable loses
the stacks, never the trace: ``load_samples`` says why, for the process's summary.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable

from ...stacks import samples_file as stack_samples
from . import disk_space

RAW_DIR = "raw"  # <a probe's trace root>/captures/<id>/raw/: where the probes write their plain JSON traces


def raw_trace_path(capture_dir: Path, raw_file: str) -> Path | None:
    """The raw trace a probe reported, resolved, if it is one of this capture's: a ``.json`` file in a
    folder ``raw`` of a folder named after the capture (``<trace root>/captures/<id>/raw/``, under the
    sidecar's trace dir or the probe's own root). None for any other path: never read nor deleted."""
    return _reported_raw_file(capture_dir, raw_file, ".json")


def raw_samples_path(capture_dir: Path, samples_file: str) -> Path | None:
    """The raw samples file a probe reported (``.stacks.msgpack``), under the same rule as its trace."""
    return _reported_raw_file(capture_dir, samples_file, stack_samples.SUFFIX)


def _reported_raw_file(capture_dir: Path, reported: str, suffix: str) -> Path | None:
    path = Path(reported).resolve()
    if not path.name.endswith(suffix) or path.parent.name != RAW_DIR or path.parent.parent.name != capture_dir.name:
        return None
    return path if path.is_file() else None


def load_samples(capture_dir: Path, samples_file: str | None) -> tuple[stack_samples.Samples | None, str | None]:
    """(the samples, None) or (None, why they are lost) for a process's reported samples file."""
    if not samples_file:
        return None, None
    path = raw_samples_path(capture_dir, samples_file)
    if path is None:
        return None, "python stacks lost: samples file missing or outside the capture's raw folder"
    try:
        return stack_samples.read(path), None
    except OSError as exc:
        return None, f"python stacks lost: samples file unreadable: {disk_space.describe(exc)}"
    except ValueError as exc:
        return None, f"python stacks lost: samples file unreadable: {exc}"


def unreadable(problem: str, raw: Path) -> str:
    """Why a raw trace cannot be used. A probe whose export ran out of space leaves an empty or
    cut-short file and may never learn why (Kineto's writer does not raise): when the disk it lies
    on is (nearly) full, that is the cause to name."""
    if disk_space.low_on_space(raw.parent):
        return f"{disk_space.NO_SPACE} ({raw.parent}): the trace was cut short ({problem})"
    return f"unreadable trace: {problem}"


def remove_raw(capture_dir: Path, files: Iterable[Path]) -> None:
    """Delete this capture's raw files, its own ``raw/`` folder, and in a probe's own trace root the
    ``raw/`` and ``<id>/`` folders they leave empty (never a folder with anything else in it)."""
    folders = set()
    for path in files:
        path.unlink(missing_ok=True)
        folders.add(path.parent)
    shutil.rmtree(capture_dir / RAW_DIR, ignore_errors=True)
    for raw_dir in folders:
        for folder in (raw_dir, raw_dir.parent):
            if folder == capture_dir.resolve():
                break
            try:
                folder.rmdir()
            except OSError:  # not empty, gone already, or not ours to remove
                break
