"""Give an engine object (an engine core, a worker, an API server's engine client) its probe and its
process telemetry, once, as a role of an ``EngineProfile``.

Both are stored in the object's ``__dict__`` under the attributes below, so a step hook reads them
with one dict lookup. A failure is logged and stored as None: it is not retried on every step, and
the engine runs on untouched.
"""

from __future__ import annotations

import logging
from typing import Any

from ..engine import EngineProfile
from ..probe import Probe
from ..telemetry import Telemetry, create_telemetry

log = logging.getLogger(__name__)

PROBE_ATTR = "_inference_sidecar_probe"  # the object's Probe, or None
TELEMETRY_ATTR = "_inference_sidecar_telemetry"  # this process's Telemetry, or None
STEPS_ATTR = "_inference_sidecar_steps"  # the object's StepRecorder, or None


def attach_probe(obj: Any, profile: EngineProfile, role: str, rank: int | None = None,
                 **probe_kwargs: Any) -> Probe | None:
    """Give ``obj`` its probe once (started); a failure is stored as None so it is not retried every
    step. ``probe_kwargs`` go to ``Probe`` (``loop``, ``on_capture_report``, ...)."""
    if PROBE_ATTR in obj.__dict__:
        return obj.__dict__[PROBE_ATTR]
    try:
        probe = Probe(role, rank, profile=profile, **probe_kwargs).start()
    except Exception as exc:
        log.warning("inference-sidecar: probe not started in %s: %s", role, exc)
        probe = None
    obj.__dict__[PROBE_ATTR] = probe
    return probe


def attach_telemetry(obj: Any, profile: EngineProfile, role: str, rank: int | None = None, *,
                     steps: bool, gpu: bool = False) -> Telemetry | None:
    """Give ``obj`` its process telemetry once: samplers started (with ``gpu``, NVML's too: one
    process per host should), and with ``steps`` a step recorder (``STEPS_ATTR``) that the step hook
    feeds. None where telemetry is off or failed to start."""
    if TELEMETRY_ATTR in obj.__dict__:
        return obj.__dict__[TELEMETRY_ATTR]
    obj.__dict__[TELEMETRY_ATTR] = None
    obj.__dict__[STEPS_ATTR] = None
    try:
        telemetry = create_telemetry(role, rank, profile=profile)
        if not telemetry.settings.enabled:
            return None
        recorder = telemetry.step_recorder(role) if steps else None
        telemetry.start_samplers(process=True, gpu=gpu)
    except Exception as exc:
        log.warning("inference-sidecar: telemetry not started in %s: %s", role, exc)
        return None
    obj.__dict__[TELEMETRY_ATTR] = telemetry
    obj.__dict__[STEPS_ATTR] = recorder
    return telemetry
