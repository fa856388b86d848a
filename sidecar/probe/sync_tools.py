"""The hidden-sync detector's tools as a probe builds them: from its engine profile.

A scan and the always-on watch both place a sync with a ``SiteLocator`` (which frames are passed
over, which phase a stack is in) and class it with an ``Allowlist``; here both come from the
``EngineProfile`` the engine integration handed to the probe (``site_locator()``: its skipped
packages and phase rules; ``sync_allowlist()``: its allowlist entries plus the user's
SIDECAR_SYNC_ALLOWLIST file). This is how an engine's own rules reach the detector without the core
naming the engine.

Imports of the detector (torch) happen inside the functions: only a process that is scanned, or
watched, pays for them.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..engine import EngineProfile
from ..common.protocol import SyncReport, SyncSpec

log = logging.getLogger(__name__)


def new_scan(spec: SyncSpec, report: Callable[[SyncReport], None], profile: EngineProfile):
    """A ``SyncScan`` for ``spec`` with the profile's locator and allowlist."""
    from ..syncs.detector import SyncDetector
    from ..syncs.scan import SyncScan

    return SyncScan(spec, report, allowlist=profile.sync_allowlist(), detector=SyncDetector(locator=profile.site_locator()))


def watch_from_environment(profile: EngineProfile, step_driven: bool):
    """``(SyncWatch, None)`` where SIDECAR_SYNC_WATCH=1 and this process can run one; ``(None, why
    not)`` where it is asked for but cannot run; ``(None, None)`` where it is off or the process
    takes no steps."""
    from ..syncs import settings

    if not settings.watch_enabled() or not step_driven:
        return None, None
    from ..syncs.watch import SyncWatch, cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is not None:
        log.warning("inference-sidecar: %s=1 but the sync watch cannot run here: %s", settings.ENV_WATCH, reason)
        return None, reason
    return SyncWatch(every=settings.watch_every(), allowlist=profile.sync_allowlist(), locator=profile.site_locator()), None
