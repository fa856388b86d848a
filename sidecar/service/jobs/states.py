"""The states of a job (a capture or a sync scan) and of each process in it, and which moves are allowed.

Each kind has two tables, job and per-process, read "from this state, these states may follow". A
state with no row is final. The sidecar moves a job only along its table: a move that is not in it is
a bug in the sidecar and raises ``TransitionError``. Per-process states mostly follow the probes'
reports; a report whose state may not follow the process's current one is dropped by the receiver
(sidecar/service/jobs/manager.py) before anything of it is applied.

Job states (``GET /profile/{id}``, ``GET /sync/{id}``, docs/api.md):
  armed      probes told; no step-driven process has started recording yet (an API server's
             window, open from "arm" on, records time, not steps)
  capturing  (captures) / scanning (scans): at least one step-driven process is recording
             (timing: a module timing's, recording: a memory snapshot's)
  exporting  (captures) every process has ended; traces are compressed, merged and analysed
  done       every selected process recorded every step asked for
  partial    something exists but something is missing; ``reason`` says what
  failed     nothing usable; ``reason`` says why
  cancelled  its user stopped it while it was armed, and no step-driven process recorded a step:
             nothing is judged, merged or kept but the job's record
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from ...common.verdicts import CANCELLED, DONE, FAILED, FINAL, PARTIAL
from ...common.protocol import P_ARMED, P_CAPTURING, P_DONE, P_EXPORTING, P_FAILED, P_SCANNING, P_TIMING
from ...common.protocol import P_RECORDING

ARMED, CAPTURING, SCANNING, EXPORTING = "armed", "capturing", "scanning", "exporting"
TIMING = "timing"  # a module-timing job: its hooks are in, in at least one process
RECORDING = "recording"  # a memory snapshot: the allocator records its history, in at least one process

# A per-process state only the sidecar gives: disconnected, silent after "arm", or not stopped
# within the grace period after a stop request.
P_LOST = "lost"
P_TERMINAL = (P_DONE, P_FAILED, P_LOST)

Table = Mapping[str, frozenset[str]]

# The verdicts of a job that was not cancelled; only an armed job can be (nothing recorded yet).
JUDGED = frozenset(FINAL) - {CANCELLED}

CAPTURE_STATES: Table = MappingProxyType({
    # Straight to exporting when every process ended before any recorded (lost, failed, a timeout):
    # the verdict is then given by the export, like any other.
    ARMED: frozenset({CAPTURING, EXPORTING, CANCELLED}),
    CAPTURING: frozenset({EXPORTING}),
    EXPORTING: JUDGED,
})

SCAN_STATES: Table = MappingProxyType({
    # A scan has nothing to export: the merge of the processes' sites is immediate.
    ARMED: frozenset({SCANNING, *FINAL}),
    SCANNING: JUDGED,
})

CAPTURE_PROCESS_STATES: Table = MappingProxyType({
    P_ARMED: frozenset({P_CAPTURING, P_FAILED, P_LOST}),
    P_CAPTURING: frozenset({P_EXPORTING, P_FAILED, P_LOST}),
    P_EXPORTING: frozenset({P_DONE, P_FAILED, P_LOST}),
    # The sidecar's own export may still reject a finished process's file (unreadable, or beyond
    # the capture's size limit).
    P_DONE: frozenset({P_FAILED}),
})

SCAN_PROCESS_STATES: Table = MappingProxyType({
    P_ARMED: frozenset({P_SCANNING, P_FAILED, P_LOST}),
    P_SCANNING: frozenset({P_DONE, P_FAILED, P_LOST}),
})

# A module-timing job, as a scan: its tables are merged at once, nothing to export.
MODULE_STATES: Table = MappingProxyType({
    ARMED: frozenset({TIMING, *FINAL}),
    TIMING: JUDGED,
})

MODULE_PROCESS_STATES: Table = MappingProxyType({
    P_ARMED: frozenset({P_TIMING, P_FAILED, P_LOST}),
    P_TIMING: frozenset({P_DONE, P_FAILED, P_LOST}),
})


# A memory snapshot, as a module timing: the probes summarise their own snapshots, nothing to export
# (each process's raw snapshot is brought in after it is done, before the verdict).
MEMORY_STATES: Table = MappingProxyType({
    ARMED: frozenset({RECORDING, *FINAL}),
    RECORDING: JUDGED,
})

MEMORY_PROCESS_STATES: Table = MappingProxyType({
    P_ARMED: frozenset({P_RECORDING, P_FAILED, P_LOST}),
    P_RECORDING: frozenset({P_DONE, P_FAILED, P_LOST}),
})


class TransitionError(RuntimeError):
    """A move the state table does not allow: a bug in the sidecar, never a probe's doing."""


def allowed(table: Table, current: str, new: str) -> bool:
    return new in table.get(current, ())


def require(table: Table, current: str, new: str, what: str) -> None:
    if not allowed(table, current, new):
        raise TransitionError(f"{what}: {current} -> {new} is not an allowed transition")
