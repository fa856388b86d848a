"""What a probe enforces itself, whatever the sidecar asks (docs/security.md).

* steps: a job (capture or scan) asking for more working steps than ``max_steps`` is refused at
  ``arm`` with a failed report naming the limit, never silently clipped;
* duration: a window that has recorded for ``max_capture_s`` closes at the next step boundary (the
  API server's window: on its event loop) and reports a ``stop_reason`` naming the limit;
* bytes: an exported trace file over ``max_trace_mb`` is deleted and the process reports failed,
  naming the limit; sampled stacks' raw samples file counts with it: when the two are over the
  limit together, the samples file is deleted and the stacks are lost, never the trace.

Read once per probe from the engine's environment; a bad value is logged as an error naming the
variable and the default is used (``config.env_number``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ...common import config


@dataclass(frozen=True)
class ProbeLimits:
    max_steps: int = config.DEFAULT_MAX_STEPS
    max_capture_s: float = config.DEFAULT_PROBE_MAX_CAPTURE_S
    max_trace_mb: float = config.DEFAULT_MAX_CAPTURE_MB

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> "ProbeLimits":
        return cls(
            max_steps=int(config.env_number(config.ENV_PROBE_MAX_STEPS, cls.max_steps, integer=True, env=env)),
            max_capture_s=config.env_number(config.ENV_PROBE_MAX_CAPTURE_S, cls.max_capture_s, env=env),
            max_trace_mb=config.env_number(config.ENV_PROBE_MAX_TRACE_MB, cls.max_trace_mb, env=env),
        )

    @property
    def max_trace_bytes(self) -> int:
        return int(self.max_trace_mb * 2**20)

    def steps_problem(self, steps: int) -> str | None:
        """Why a job of ``steps`` working steps is refused here (None: it is not)."""
        if steps <= self.max_steps:
            return None
        return (f"asks for {steps} steps, over this process's limit "
                f"{config.ENV_PROBE_MAX_STEPS}={self.max_steps}")

    @property
    def duration_reason(self) -> str:
        return f"{config.ENV_PROBE_MAX_CAPTURE_S}={self.max_capture_s:g} s limit of this process reached"

    def trace_problem(self, size: int) -> str | None:
        if size <= self.max_trace_bytes:
            return None
        return (f"trace of {size / 2**20:.1f} MiB over this process's limit "
                f"{config.ENV_PROBE_MAX_TRACE_MB}={self.max_trace_mb:g} MiB: deleted")

    def samples_problem(self, trace_size: int, samples_size: int) -> str | None:
        """Why a samples file of ``samples_size`` bytes beside a trace of ``trace_size`` is not kept."""
        if trace_size + samples_size <= self.max_trace_bytes:
            return None
        return (f"samples file of {samples_size / 2**20:.1f} MiB beside a trace of {trace_size / 2**20:.1f} MiB "
                f"over this process's limit {config.ENV_PROBE_MAX_TRACE_MB}={self.max_trace_mb:g} MiB: deleted")
