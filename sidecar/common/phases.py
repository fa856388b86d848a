"""A step's phases: the engine-neutral names in which an engine profile says what its processes' named
ranges time (``PhaseRange``, ``EngineProfile.phase_ranges``), and in which the analysis reports a
step's anatomy (sidecar/analysis/questions/anatomy.py).

An engine maps its own range names onto these phases. A capture writes its process's map into its
trace, as the top-level member ``TRACE_MEMBER`` (``{"phase_ranges": {range name: phase}}``), which
the sidecar's merged trace keeps: a trace then says itself which of its ranges are phases, and the
analysis needs neither the engine's plugin nor its name. The same member says whether the process's
step ranges are whole (``WHOLE_STEPS_KEY``; per process in a merged trace, ``WHOLE_STEPS_PIDS_KEY``).
No imports: the analysis imports this.
"""

from __future__ import annotations

from dataclasses import dataclass

# (name, label for people), in the order a step runs them.
PHASES: tuple[tuple[str, str], ...] = (
    ("input", "input processing"),  # a request made into the engine's own request (API server)
    ("schedule", "schedule"),
    ("dispatch", "send to workers"),
    ("wait_model", "wait for the model"),
    ("prepare", "prepare inputs"),
    ("forward", "forward"),
    ("sample", "sample"),
    ("update", "update from output"),
    ("output", "output processing"),  # outputs made into responses: detokenisation (API server)
)
PHASE_NAMES = frozenset(name for name, _ in PHASES)
FORWARD_PHASE = "forward"  # the phase whose ranges the analysis measures the time between
# Phases during which a process waits for another (the engine core for its workers): the time is the
# other process's work, so such a phase is never named the largest.
WAITING_PHASES = frozenset({"wait_model"})

TRACE_MEMBER = "inference_sidecar"  # top-level member of a capture's trace (the merged one's too)
PHASE_RANGES_KEY = "phase_ranges"  # in it: {range name: phase}
# In a step-driven process's trace: true when none of its ProfilerStep ranges is cut off. The probe
# (sidecar/probe/capture/profiler.py) opens each range at the begin of a step announced with work and closes
# the last at a step boundary (the end of the window's last working step, or the first boundary after
# a stop request or the time limit), never inside a step, and every range holds a step that did work.
# Each range but the last holds the idle time until the next one began; the last ends with its step,
# so it may be much shorter than the others and is still whole. Absent (a plain torch.profiler trace,
# an API server's window) or false: the analysis judges the last range by its length.
WHOLE_STEPS_KEY = "whole_steps"
# In the merged trace's member: the pids (as the merged trace writes them) of the processes whose own
# trace said ``WHOLE_STEPS_KEY``.
WHOLE_STEPS_PIDS_KEY = "whole_steps_pids"


def label(phase: str) -> str:
    return next((text for name, text in PHASES if name == phase), phase)


@dataclass(frozen=True)
class PhaseRange:
    """A named range a process of role ``role`` records during a capture (and only then), and the
    phase it times. ``name`` is the range's exact name in the trace: the engine's own scope where it
    has one, else one the integration enters (a ``record_function``)."""

    name: str
    phase: str  # one of PHASE_NAMES
    role: str

    def __post_init__(self) -> None:
        if self.phase not in PHASE_NAMES:
            raise ValueError(f"phase range {self.name!r}: unknown phase {self.phase!r}; "
                             f"phases: {', '.join(name for name, _ in PHASES)}")
