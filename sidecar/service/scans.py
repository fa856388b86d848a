"""Hidden-sync scans: N working steps of every selected engine process, one report of sync sites.

Same conventions as captures (captures.py): one at a time, ``armed`` → ``scanning`` → ``done`` /
``partial`` / ``failed`` with a reason, a timeout, an early stop. The detector itself runs in the
engine processes (sidecar/syncs); the sidecar merges their reports, compares with a baseline scan
when asked, and keeps the last K reports on disk so later scans can use them as baselines.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..syncs.allowlist import EXPECTED, HIDDEN
from ..syncs.report import merge_reports, new_sites
from .params import ScanRequest
from .jobs import OneJobAtATime
from .registry import ProbeConnection, ProbeRegistry

log = logging.getLogger(__name__)

ARMED, SCANNING, DONE, PARTIAL, FAILED = "armed", "scanning", "done", "partial", "failed"
FINAL = (DONE, PARTIAL, FAILED)
P_TERMINAL = ("done", "failed", "lost")


@dataclass(eq=False)
class ScanProcess:
    conn: ProbeConnection
    label: str
    role: str
    pid: int
    rank: int | None
    state: str = "armed"
    steps_recorded: int = 0
    error: str | None = None
    report: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "pid": self.pid, "rank": self.rank, "label": self.label, "state": self.state,
                "steps_recorded": self.steps_recorded, "error": self.error}


@dataclass(eq=False)
class Scan:
    id: str
    request: ScanRequest
    processes: list[ScanProcess]
    state: str = ARMED
    reason: str | None = None
    stop_reason: str | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    sites: list[dict[str, Any]] = field(default_factory=list)
    new_sites: list[dict[str, Any]] | None = None
    treat_cpu_as_device: bool | None = None
    baseline_sites: list[dict[str, Any]] | None = None
    done_event: asyncio.Event = field(default_factory=asyncio.Event)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "state": self.state, "reason": self.reason, "steps": self.request.steps,
            "delay": self.request.delay, "created_at": self.created_at, "finished_at": self.finished_at,
            "treat_cpu_as_device": self.treat_cpu_as_device,
            "hidden": sum(1 for s in self.sites if s.get("classification") == HIDDEN),
            "expected": sum(1 for s in self.sites if s.get("classification") == EXPECTED),
            "sites": self.sites, "baseline": self.request.baseline, "new_sites": self.new_sites,
            "processes": [p.to_json() for p in self.processes],
        }


class ScanManager(OneJobAtATime):
    def __init__(self, registry: ProbeRegistry, store_dir: Path, keep: int, stop_grace_s: float = 10.0,
                 on_finished: Callable[[Scan], None] | None = None) -> None:
        super().__init__()
        self._registry = registry
        self._dir = store_dir
        self._keep = keep
        self._grace = stop_grace_s
        self._on_finished = on_finished
        self._scans: "OrderedDict[str, Scan]" = OrderedDict()


    def get(self, scan_id: str) -> Scan | None:
        return self._scans.get(scan_id)

    def recent(self) -> list[Scan]:
        return list(reversed(self._scans.values()))

    async def start(self, request: ScanRequest) -> Scan:
        from .captures import CaptureBusy, NoProbes
        from .params import ParamError

        if self._active is not None:
            raise CaptureBusy(self._active)
        baseline = None
        if request.baseline is not None:
            baseline = self._load(request.baseline)
            if baseline is None:
                raise ParamError("baseline", f"no saved scan {request.baseline!r} (see /syncs)")
        conns = self._registry.all()
        if not conns:
            raise NoProbes("no engine process is connected to the sidecar")
        chosen = [c for c in conns if c.identity.step_driven and request.selects(c.identity.role, c.identity.rank)]
        if not chosen:
            have = ", ".join(c.identity.label for c in conns)
            raise ParamError("processes", f"selects no engine core or worker among the connected processes ({have})")
        scan = Scan(
            id="s" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3),
            request=request,
            processes=[ScanProcess(c, c.identity.label, c.identity.role, c.identity.pid, c.identity.rank) for c in chosen],
        )
        scan.baseline_sites = baseline.get("sites", []) if baseline else None
        self._scans[scan.id] = scan
        self._active = scan
        arm = {"type": "sync_arm", "scan": {"id": scan.id, "steps": request.steps, "delay": request.delay}}
        for proc in scan.processes:
            if not await proc.conn.send(arm):
                proc.state, proc.error = "lost", "probe unreachable when arming"
        self._spawn(self._watch_timeout(scan))
        self._maybe_finish(scan)
        return scan

    async def stop(self, reason: str = "stopped by request") -> Scan | None:
        scan = self._active
        if scan is None:
            return None
        await self._request_stop(scan, reason)
        return scan

    async def _request_stop(self, scan: Scan, reason: str) -> None:
        scan.stop_reason = scan.stop_reason or reason
        for proc in scan.processes:
            if proc.state not in P_TERMINAL:
                await proc.conn.send({"type": "sync_stop", "scan_id": scan.id, "reason": reason})
        self._spawn(self._give_up_after_grace(scan))

    def on_probe_report(self, conn: ProbeConnection, msg: dict[str, Any]) -> None:
        scan = self._scans.get(str(msg.get("scan_id")))
        if scan is None or scan is not self._active:
            return
        proc = next((p for p in scan.processes if p.conn is conn), None)
        if proc is None or proc.state in P_TERMINAL:
            return
        proc.steps_recorded = int(msg.get("steps_recorded") or 0)
        state = msg.get("state")
        if state == "scanning":
            proc.state = "scanning"
            scan.state = SCANNING
        elif state == "done":
            proc.state, proc.report = "done", {**msg, "process": proc.label}
            scan.treat_cpu_as_device = bool(msg.get("treat_cpu_as_device"))
        elif state == "failed":
            proc.state, proc.error = "failed", str(msg.get("error") or "failed")
        self._maybe_finish(scan)

    def on_probe_lost(self, conn: ProbeConnection) -> None:
        scan = self._active
        if scan is None:
            return
        for proc in scan.processes:
            if proc.conn is conn and proc.state not in P_TERMINAL:
                proc.state, proc.error = "lost", "probe disconnected during the scan"
        self._maybe_finish(scan)

    def _maybe_finish(self, scan: Scan) -> None:
        if scan is not self._active or any(p.state not in P_TERMINAL for p in scan.processes):
            return
        self._active = None
        reports = [p.report for p in scan.processes if p.report is not None]
        scan.sites = merge_reports(reports)["sites"] if reports else []
        if scan.baseline_sites is not None:
            scan.new_sites = new_sites(scan.sites, scan.baseline_sites)
        reasons = [scan.stop_reason] if scan.stop_reason else []
        for p in scan.processes:
            if p.state != "done":
                reasons.append(f"{p.label}: {p.error or p.state}")
            elif p.steps_recorded < scan.request.steps:
                reasons.append(f"{p.label}: scanned {p.steps_recorded} of {scan.request.steps} steps")
        scan.state = FAILED if not reports else (PARTIAL if reasons else DONE)
        scan.reason = "; ".join(reasons) or None
        scan.finished_at = time.time()
        scan.done_event.set()
        self._save(scan)
        if self._on_finished is not None:
            self._on_finished(scan)

    def _save(self, scan: Scan) -> None:
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
            (self._dir / f"{scan.id}.json").write_text(json.dumps(scan.to_json(), indent=1))
        except OSError as exc:
            log.warning("scan %s: cannot save: %s", scan.id, exc)
        finished = [s for s in self._scans.values() if s.state in FINAL]
        for old in finished[: max(0, len(finished) - self._keep)]:
            self._scans.pop(old.id, None)
            (self._dir / f"{old.id}.json").unlink(missing_ok=True)

    def _load(self, scan_id: str) -> dict[str, Any] | None:
        scan = self._scans.get(scan_id)
        if scan is not None and scan.state in FINAL:
            return scan.to_json()
        try:  # a scan saved by an earlier run of the sidecar
            return json.loads((self._dir / f"{scan_id}.json").read_text())
        except (OSError, ValueError):
            return None


    async def _give_up_after_grace(self, scan: Scan) -> None:
        await asyncio.sleep(self._grace)
        if scan is not self._active:
            return
        for proc in scan.processes:
            if proc.state not in P_TERMINAL:
                proc.state, proc.error = "lost", "did not stop within the grace period (idle engine?)"
        self._maybe_finish(scan)


