"""Environment variables of the sync detector, one constant each (see docs/syncs.md).

Constructor arguments override the environment; a bad environment value is logged as an error naming
the variable and replaced by the default (booleans are read by ``sidecar.common.config.env_flag``, the one
parser of boolean settings), so a typo never stops an engine from starting.
"""

from __future__ import annotations

import logging
import os

from ..common.config import env_flag

log = logging.getLogger(__name__)

# 1: CPU tensors count as device tensors, so a machine without a GPU shows the syncs its code would
# cause on one. Tensors allocated by a factory call (torch.empty, zeros, full, arange, torch.tensor)
# inside the scanned step stand for host buffers; see docs/syncs.md for the exact rule.
ENV_TREAT_CPU_AS_DEVICE = "SIDECAR_SYNC_TREAT_CPU_AS_DEVICE"

# Path of a JSON file with extra allowlist entries (format in docs/syncs.md).
ENV_ALLOWLIST = "SIDECAR_SYNC_ALLOWLIST"


def treat_cpu_as_device() -> bool:
    return env_flag(ENV_TREAT_CPU_AS_DEVICE)


def allowlist_path() -> str | None:
    raw = os.environ.get(ENV_ALLOWLIST, "").strip()
    return raw or None


# 1: the always-on sync watch (watch.py) runs in every engine process that has CUDA. Off by default
# until it has been run on a CUDA host (docs/syncs.md, "Always-on watch").
ENV_WATCH = "SIDECAR_SYNC_WATCH"

# The watch samples one working step in this many (default 16).
ENV_WATCH_EVERY = "SIDECAR_SYNC_WATCH_EVERY"


def watch_enabled() -> bool:
    return env_flag(ENV_WATCH)


def watch_every(default: int = 16) -> int:
    raw = os.environ.get(ENV_WATCH_EVERY, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        log.warning("%s=%r is not a positive integer; using %d", ENV_WATCH_EVERY, raw, default)
        return default
    return value
