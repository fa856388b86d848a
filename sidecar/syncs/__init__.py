"""Hidden-sync detector: which lines of an engine's step make the host wait for the device.

``SyncScan`` (scan.py) scans N working steps, a step window like a capture's (sidecar/step_window.py;
its ``SyncSpec`` is in sidecar.protocol); ``SyncDetector``
(detector.py) does the catching; report.py holds the per-site report, baseline comparison and the
merge across processes; allowlist.py says which sites are expected; ``SyncWatch`` (watch.py) is the
always-on, sampled watch for CUDA hosts. See docs/syncs.md.

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
    "SyncSpec": "..protocol",  # a scan's spec is a probe-channel message part
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
