"""The sidecar service's settings (``sidecar serve`` flags)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..export.disk_space import MIN_FREE_BYTES
from ..jobs.manager import STOP_GRACE_S
from ..store.uploads import BACKOFF_S, MAX_PENDING, RETRY_FOR_S


@dataclass(frozen=True)
class ServiceSettings:
    trace_dir: Path
    probe_token: str  # always required on the probe channel
    http_token: str | None  # required on the HTTP API when set
    max_steps: int
    max_capture_bytes: int
    keep: int  # finished jobs kept, per kind
    keep_bytes: int | None = None  # and at most this many bytes of them on disk, per kind (None: no bound)
    min_free_bytes: int = MIN_FREE_BYTES  # a capture is refused (507) below this much free space
    stop_grace_s: float = STOP_GRACE_S  # how long stopped processes get to report before they count as lost
    triggers: tuple[Any, ...] = ()  # TriggerRule: installed at start (sidecar serve --triggers FILE)
    # AlertAction: what POST /alerts acts on (sidecar serve --alert-actions FILE; none: every alert is skipped),
    # and the instance label values that name this sidecar's server (--alert-instance; none: derived).
    alert_actions: tuple[Any, ...] = ()
    alert_instances: tuple[str, ...] = ()
    # Host names a browser may use to reach the sidecar besides loopback names and IP addresses
    # (sidecar serve --allowed-host; sidecar/service/browser_guard.py): anything else is a DNS-rebinding page's.
    allowed_hosts: tuple[str, ...] = ()
    # The object store (sidecar serve --store URL; docs/fleet.md, "Object storage"): None, the local disk alone.
    # Its instance names this sidecar's folder of fleet captures and recorder dumps (default: the host name);
    # the queue's bound; whether retention removes the stored copies too.
    store_url: str | None = None
    store_instance: str | None = None
    store_queue: int = MAX_PENDING
    store_retention: bool = False
    store_retry_for_s: float = RETRY_FOR_S
    store_backoff_s: tuple[float, float] = BACKOFF_S
