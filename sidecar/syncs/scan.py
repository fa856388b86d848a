"""Scan exactly N working steps of one process for hidden syncs.

``SyncScan`` has the step interface of ``sidecar.probe.recorder.StepCapture`` so a probe can drive
either: ``on_step_begin(has_work)`` / ``on_step_end(did_work)`` on the step thread,
``request_stop(reason)`` from any thread, ``finished``. The detector is armed on the step thread at
the beginning of the first working step (after ``delay`` working steps) and disarmed at the end of
the N-th; steps with no work are not scanned or counted. Findings go out through ``report(dict)``:

  {"type": "sync", "scan_id", "state": "scanning"|"done"|"failed", "steps_recorded",
   "treat_cpu_as_device", "sites": [...], "stop_reason"?, "error"?}

``sites`` (report.py) comes with ``done``. A scan stopped early still reports ``done`` with what it
saw, and ``stop_reason``; one stopped before its first step reports ``failed``.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .allowlist import Allowlist
from .detector import SyncDetector
from .report import build_sites

log = logging.getLogger(__name__)

Report = Callable[[dict[str, Any]], None]

ARMED, RECORDING, FINISHED = "armed", "recording", "finished"
S_SCANNING, S_DONE, S_FAILED = "scanning", "done", "failed"


@dataclass(frozen=True)
class SyncSpec:
    id: str
    steps: int
    delay: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "steps": self.steps, "delay": self.delay}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SyncSpec":
        spec = cls(id=str(d["id"]), steps=int(d["steps"]), delay=int(d.get("delay", 0)))
        if spec.steps < 1 or spec.delay < 0:
            raise ValueError(f"steps must be >= 1 and delay >= 0, got {spec.steps} and {spec.delay}")
        return spec


class SyncScan:
    def __init__(
        self,
        spec: SyncSpec,
        report: Report,
        allowlist: Optional[Allowlist] = None,
        detector: Optional[SyncDetector] = None,
    ) -> None:
        self.spec = spec
        self._report = report
        self._allowlist = allowlist if allowlist is not None else Allowlist()
        self._detector = detector if detector is not None else SyncDetector()
        self._lock = threading.Lock()
        self.state = ARMED
        self._to_skip = spec.delay
        self._recorded = 0
        self._stop_reason: Optional[str] = None

    # -- called on the step thread -------------------------------------------------------------
    def on_step_begin(self, has_work: bool) -> None:
        if self._stop_reason is not None:
            self._finish()
            return
        if self.state == ARMED:
            if not (has_work and self._to_skip == 0) or not self._start():
                return
        if self.state == RECORDING and has_work:
            self._detector.step_begin(self._recorded)

    def on_step_end(self, did_work: bool) -> None:
        if self.state == ARMED:
            if did_work and self._to_skip > 0:
                self._to_skip -= 1
            return
        if self.state != RECORDING:
            return
        self._detector.step_end()
        if did_work:
            self._recorded += 1
        if self._recorded >= self.spec.steps or self._stop_reason is not None:
            self._finish()

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    # -- called from any thread -------------------------------------------------------------------
    def request_stop(self, reason: str) -> bool:
        """Ask the scan to end early. Returns True if it ended now (it had not started)."""
        with self._lock:
            if self.state == FINISHED:
                return True
            self._stop_reason = reason
            cancelled = self.state == ARMED
            if cancelled:
                self.state = FINISHED
        if cancelled:
            self._send(S_FAILED, error=f"no step scanned before the scan ended ({reason})")
        return cancelled

    # -- internals ------------------------------------------------------------------------------
    def _start(self) -> bool:
        with self._lock:
            if self.state != ARMED:
                return False
            try:
                self._detector.arm()
            except Exception as exc:  # the engine must keep serving whatever happens here
                self.state = FINISHED
                log.warning("inference-sidecar: sync detector failed to arm: %s", exc)
                self._send(S_FAILED, error=f"sync detector failed to arm: {exc}")
                return False
            self.state = RECORDING
        self._send(S_SCANNING)
        return True

    def _finish(self) -> None:
        with self._lock:
            if self.state == FINISHED:
                return
            was_recording = self.state == RECORDING
            self.state = FINISHED
        if not was_recording:
            return
        try:
            self._detector.disarm()
            sites = build_sites(self._detector.stats(), self._recorded, self._allowlist)
        except Exception as exc:
            log.warning("inference-sidecar: sync scan failed to finish: %s", exc)
            self._send(S_FAILED, error=f"sync scan failed to finish: {exc}")
            return
        self._send(S_DONE, sites=sites)

    def _send(self, state: str, **fields: Any) -> None:
        msg = {
            "type": "sync",
            "scan_id": self.spec.id,
            "state": state,
            "steps_recorded": self._recorded,
            "treat_cpu_as_device": self._detector.treat_cpu_as_device,
            **fields,
        }
        if self._stop_reason is not None:
            msg["stop_reason"] = self._stop_reason
        self._report(msg)
