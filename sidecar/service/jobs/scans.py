"""Hidden-sync scans: N working steps of every selected engine process, one report of sync sites.

The detector runs in the engine processes (sidecar/syncs). What is a scan's own, on top of the shared
life cycle (manager.py): the baseline (an earlier scan, kept on disk across sidecar restarts),
the merge of the processes' sites, and the report saved as ``<trace-dir>/scans/<id>.json`` so that
later scans can use it as their baseline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from ...common.protocol import SyncArm, SyncReport, SyncSpec
from ...syncs.allowlist import EXPECTED, HIDDEN
from ...syncs.report import merge_reports, new_sites
from .arming import ARM_REPLY_S
from .board import JobBoard
from .manager import STOP_GRACE_S, JobManager
from .states import FINAL
from .model import SCAN, Job, JobKind, ProcessRun
from .params import ParamError, ScanRequest
from ..channel.registry import ProbeRegistry
from .storing import JobStore, read_stored
from .saved import SavedAsOneFile, id_time, read_saved


@dataclass(eq=False, kw_only=True)
class ScanProcess(ProcessRun):
    json_fields = ("role", "pid", "rank", "label", "state", "steps_recorded", "error")

    sites: list[dict[str, Any]] | None = None  # with "done": the process's sites (sidecar.syncs.report)


@dataclass(eq=False, kw_only=True)
class Scan(Job):
    kind: ClassVar[JobKind] = SCAN

    request: ScanRequest
    processes: list[ScanProcess]
    sites: list[dict[str, Any]] = field(default_factory=list)
    new_sites: list[dict[str, Any]] | None = None
    treat_cpu_as_device: bool | None = None
    baseline_sites: list[dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        """The report: ``GET /sync/{id}``, the saved file, a later scan's baseline (docs/syncs.md)."""
        return {
            "id": self.id, "state": self.state, "reason": self.reason, "steps": self.request.steps,
            "delay": self.request.delay, "created_at": self.created_at, "finished_at": self.finished_at,
            "treat_cpu_as_device": self.treat_cpu_as_device,
            "hidden": sum(1 for s in self.sites if s.get("classification") == HIDDEN),
            "expected": sum(1 for s in self.sites if s.get("classification") == EXPECTED),
            "sites": self.sites, "baseline": self.request.baseline, "new_sites": self.new_sites,
            "processes": [p.to_json() for p in self.processes],
            "notes": self.notes,
            "stored": self.stored,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Scan":
        """A report saved by ``to_json`` (an earlier run of the sidecar), as a finished scan."""
        scan = cls(
            id=data["id"], state=data["state"], reason=data.get("reason"),
            request=ScanRequest(steps=int(data.get("steps") or 0), delay=int(data.get("delay") or 0),
                                baseline=data.get("baseline")),
            processes=[ScanProcess.from_json(p) for p in data.get("processes") or []],
            sites=list(data.get("sites") or []), new_sites=data.get("new_sites"),
            treat_cpu_as_device=data.get("treat_cpu_as_device"),
            created_at=float(data.get("created_at") or id_time(SCAN, data["id"]) or 0.0),
            finished_at=data.get("finished_at"), notes=list(data.get("notes") or []),
        )
        scan.stored = read_stored(data.get("stored"))
        scan.done_event.set()
        return scan


class ScanManager(SavedAsOneFile, JobManager[Scan]):
    kind = SCAN
    saved_noun = "scan"
    store_kind, store_folder = "scan", "scans"
    job_from_json = Scan.from_json

    def __init__(
        self,
        registry: ProbeRegistry,
        board: JobBoard,
        store_dir: Path,
        *,
        keep: int,
        keep_bytes: int | None = None,
        stop_grace_s: float = STOP_GRACE_S,
        arm_reply_s: float = ARM_REPLY_S,
        on_finished: Callable[[Scan], None] | None = None,
        store: JobStore | None = None,
    ) -> None:
        super().__init__(registry, board, keep=keep, keep_bytes=keep_bytes, stop_grace_s=stop_grace_s, arm_reply_s=arm_reply_s,
                         on_finished=on_finished, store=store)
        self._dir = store_dir
        self._adopt(self._restore())

    def _create(self, request: ScanRequest) -> Scan:
        baseline = None
        if request.baseline is not None:
            baseline = self._load(request.baseline)
            if baseline is None:
                raise ParamError("baseline", f"no saved scan {request.baseline!r} (see /syncs)")
        # The API server takes no steps: only step-driven processes are scanned.
        chosen = self._select(request)
        return Scan(
            id=self.kind.new_id(), request=request,
            processes=[ScanProcess(conn=c, identity=c.identity) for c in chosen],
            baseline_sites=baseline.get("sites", []) if baseline else None,
        )

    def _arm_message(self, scan: Scan) -> SyncArm:
        return SyncArm(spec=SyncSpec(id=scan.id, steps=scan.request.steps))

    def _take_result(self, scan: Scan, rec: ScanProcess, report: SyncReport) -> None:
        rec.sites = report.sites or []
        scan.treat_cpu_as_device = report.treat_cpu_as_device
        if report.graph_steps:  # said, not left as silence: sidecar/common/cuda_graphs.py
            scan.notes.append(f"{rec.label}: {report.graph_steps} of {report.steps_recorded} steps replayed a CUDA "
                              f"graph ({report.graph_replays} replays): the ops inside a replay do not run on the "
                              "host, so the scan saw none of them (a graph holds no sync: CUDA refuses one while a "
                              "graph is captured)")

    async def _finish(self, scan: Scan) -> None:
        reports = [{"process": p.label, "steps_recorded": p.steps_recorded, "sites": p.sites}
                   for p in scan.processes if p.sites is not None]
        scan.sites = merge_reports(reports)["sites"] if reports else []
        if scan.baseline_sites is not None:
            scan.new_sites = new_sites(scan.sites, scan.baseline_sites)
        self._conclude(scan, [], has_result=bool(reports))

    def _load(self, scan_id: str) -> dict[str, Any] | None:
        scan = self._jobs.get(scan_id)
        if scan is not None and scan.state in FINAL:
            return scan.to_json()
        return read_saved(self._path(scan_id))  # saved by an earlier run; a planted link is not followed
