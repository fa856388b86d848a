"""The sidecar service's settings (``sidecar serve`` flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .job_manager import STOP_GRACE_S


@dataclass(frozen=True)
class ServiceSettings:
    trace_dir: Path
    probe_token: str  # always required on the probe channel
    http_token: str | None  # required on the HTTP API when set
    max_steps: int
    max_capture_bytes: int
    keep: int  # finished jobs kept, per kind
    stop_grace_s: float = STOP_GRACE_S  # how long stopped processes get to report before they count as lost
