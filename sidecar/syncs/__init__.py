"""Hidden-sync detector: which lines of an engine's step make the host wait for the device
(docs/syncs.md). Imports only sidecar.common; sidecar.engine builds a profile's locator and allowlist
from it. Sync sites read back from a trace file are sidecar.analysis.sync_sites.

    scan       ``SyncScan``: N working steps of one process scanned, a step window like a capture's
    detector   ``SyncDetector``: catches every host-device sync made on the thread that armed it
    ops        which aten calls make the host wait for the device, and their names in a report
    patches    syncs that never reach torch's dispatcher, caught by wrapping Python attributes while armed
    sites      where a sync came from (the first frame outside torch and this project) and its step phase
    allowlist  which sites are expected: the engine's deliberate transfers plus the user's own file
    report     the per-site report, the baseline comparison, the merge across processes
    settings   the detector's environment variables
    watch      ``SyncWatch``: the always-on, sampled watch for CUDA hosts

Exports load lazily (PEP 562): the sidecar process merges reports without importing torch, which
the detector needs and which costs it a second at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module holding it, relative to this package.
_EXPORTS = {
    "AllowEntry": ".allowlist", "Allowlist": ".allowlist", "EXPECTED": ".allowlist", "HIDDEN": ".allowlist",
    "from_environment": ".allowlist", "load_entries": ".allowlist",
    "SyncDetector": ".detector",
    "build_sites": ".report", "merge_reports": ".report", "merge_watch_reports": ".report", "new_sites": ".report",
    "SyncScan": ".scan",
    "SyncSpec": "..common.protocol",  # a scan's spec is a probe-channel message part
    "ENV_ALLOWLIST": ".settings", "ENV_TREAT_CPU_AS_DEVICE": ".settings", "ENV_WATCH": ".settings",
    "ENV_WATCH_EVERY": ".settings",
    "PhaseRule": ".sites", "SiteLocator": ".sites",
    "SyncWatch": ".watch", "cuda_unavailable_reason": ".watch",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module, __name__), name)
