"""What a job saved on disk gives back after a sidecar restart: the pieces every kind rebuilds
(its processes' identities, when it was created, its JSON read safely). The disk is the truth: a
restarted sidecar lists, serves and retains the jobs an earlier run left (capture_index.py, scans.py).
"""

from __future__ import annotations

import calendar
import json
import logging
import time
from pathlib import Path
from typing import Any

from ..engine import STANDARD_ROLES
from ..protocol import ProcessIdentity
from .jobs import JobKind

log = logging.getLogger(__name__)

_STEP_DRIVEN = {r.name: r.step_driven for r in STANDARD_ROLES}


def read_saved(path: Path) -> dict[str, Any] | None:
    """A saved job's JSON object; None when missing, empty (a full disk) or corrupt (a crash)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def id_time(kind: JobKind, job_id: str) -> float | None:
    """When the job was created, from its id (``YYYYmmdd-HHMMSS`` UTC after the kind's prefix)."""
    stamp = job_id[len(kind.id_prefix):len(kind.id_prefix) + 15]
    try:
        return float(calendar.timegm(time.strptime(stamp, "%Y%m%d-%H%M%S")))
    except ValueError:
        return None


def identity_from_json(p: dict[str, Any]) -> ProcessIdentity:
    """A process's identity from its saved JSON (role, pid, rank, label). The saved label is
    ``<role label>[ rank k] (pid n)``, so the role label is what precedes that suffix. Whether the
    role is step-driven is not saved: a standard role's own, else step-driven (only the order of a
    listing depends on it once a job has ended)."""
    role, pid, rank = str(p.get("role") or "unknown"), int(p.get("pid") or 1), p.get("rank")
    label = str(p.get("label") or role)
    suffix = (f" rank {rank}" if rank is not None else "") + f" (pid {pid})"
    role_label = label[: -len(suffix)] if label.endswith(suffix) and len(label) > len(suffix) else role
    return ProcessIdentity(role=role, role_label=role_label, step_driven=_STEP_DRIVEN.get(role, True),
                           pid=max(1, pid), rank=rank if isinstance(rank, int) else None,
                           instance=str(p.get("instance") or ""))
