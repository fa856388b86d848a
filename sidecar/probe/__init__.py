"""The engine-side half: records steps on request of the sidecar. See probe.Probe."""

from .probe import Probe

__all__ = ["Probe"]
