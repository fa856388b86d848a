"""Scan exactly N working steps of one process for hidden syncs.

``SyncScan`` is a step window (sidecar/common/step_window.py), like a capture: armed, it waits for the
sidecar's ``begin(start_step)``; the detector is armed on the step thread at the beginning of the
first working step at or after the start step, enabled for each working step of the window, and
disarmed at the end of the N-th; steps with no work are not scanned or counted. Findings go out as
``SyncReport`` structs (sidecar.common.protocol): ``armed`` (with the process's working-step count, from
``report_armed``), ``scanning``, then ``done`` with ``sites`` (report.py). A scan stopped early
still reports ``done`` with what it saw, and ``stop_reason``; one stopped before its first step
reports ``failed``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from ..common.cuda_graphs import GraphReplays
from ..common.step_window import StepWindow
from ..common.protocol import P_DONE, P_SCANNING, SyncReport, SyncSpec
from .allowlist import Allowlist
from .detector import SyncDetector
from .report import build_sites

log = logging.getLogger(__name__)

Report = Callable[[SyncReport], None]


class SyncScan(StepWindow):
    RECORDING_STATE = P_SCANNING
    OPEN_FAILED = "sync detector failed to arm"
    CANCELLED = "no step scanned before the scan ended"

    def __init__(
        self,
        spec: SyncSpec,
        report: Report,
        allowlist: Optional[Allowlist] = None,
        detector: Optional[SyncDetector] = None,
        graphs: Optional[GraphReplays] = None,
    ) -> None:
        """``graphs``: counts the engine's CUDA graph replays in the window (default: torch's class);
        ops inside a replay never run on the host, so the scan says how many steps it could not see into."""
        super().__init__(spec.steps)
        self.spec = spec
        self._report = report
        self._allowlist = allowlist if allowlist is not None else Allowlist()
        self._detector = detector if detector is not None else SyncDetector()
        self._graphs = graphs if graphs is not None else GraphReplays()

    # -- the window's hooks (step thread) ----------------------------------------------------------
    def _start_recording(self) -> None:
        self._detector.arm()
        try:
            self._graphs.install()
        except Exception as exc:  # no count of replays: the scan goes on
            log.warning("inference-sidecar: CUDA graph replays not counted: %s", exc)

    def _step_began(self, n: int, new: bool) -> None:
        self._detector.step_begin(n)  # every working step: one that did no work is scanned again
        self._graphs.step_began()

    def _step_ended(self) -> None:
        self._detector.step_end()
        self._graphs.step_ended()

    def _stop_recording(self) -> None:
        self._graphs.uninstall()
        try:
            self._detector.disarm()
            sites = build_sites(self._detector.stats(), self._recorded, self._allowlist)
        except Exception as exc:
            log.warning("inference-sidecar: sync scan failed to finish: %s", exc)
            self._fail(f"sync scan failed to finish: {exc}")
            return
        self._report_state(P_DONE, sites=sites, graph_steps=self._graphs.steps, graph_replays=self._graphs.replays)

    def _report_state(self, state: str, **fields: Any) -> None:
        self._report(SyncReport(
            job_id=self.spec.id, state=state, steps_recorded=self._recorded, first_step=self.first_step,
            stop_reason=self._stop_reason, treat_cpu_as_device=self._detector.treat_cpu_as_device, **fields))
