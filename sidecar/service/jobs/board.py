"""Every kind's ``JobManager`` in one place: one job at a time across kinds, and the probes' reports
routed to the job they name."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from ...common.protocol import JobReport
from .model import Job, JobBusy, JobKind

if TYPE_CHECKING:
    from ..channel.registry import ProbeConnection

log = logging.getLogger(__name__)


class Manager(Protocol):
    """What the board needs of a kind's manager (``job_manager.JobManager``, which registers
    itself here): the board never builds or drives one, so it does not import it."""

    kind: JobKind

    @property
    def active(self) -> Job | None: ...

    def get(self, job_id: str) -> Job | None: ...

    async def on_report(self, conn: "ProbeConnection", report: JobReport) -> None: ...

    async def on_probe_lost(self, conn: "ProbeConnection") -> None: ...

    async def close(self) -> None: ...


class JobBoard:
    def __init__(self) -> None:
        self._managers: list[Manager] = []

    def add(self, manager: Manager) -> None:
        self._managers.append(manager)

    @property
    def active(self) -> Job | None:
        return next((m.active for m in self._managers if m.active is not None), None)

    def ensure_free(self) -> None:
        """Raise ``JobBusy`` while a job of any kind runs: a capture would record a scan's
        detector, a scan would count a profiler's syncs."""
        active = self.active
        if active is not None:
            raise JobBusy(active)

    async def on_report(self, conn: "ProbeConnection", report: JobReport) -> None:
        # Job ids are unique across kinds (a scan's has a prefix), so the id finds the manager.
        for manager in self._managers:
            if manager.get(report.job_id) is None:
                continue
            if not isinstance(report, manager.kind.report):
                log.warning("probe %s: a %s report for %s %s; dropped", conn.identity.label,
                            type(report).__name__, manager.kind.name, report.job_id)
                return
            await manager.on_report(conn, report)
            return
        log.debug("probe %s: report for unknown job %s (removed by retention?)", conn.identity.label, report.job_id)

    async def on_probe_lost(self, conn: "ProbeConnection") -> None:
        for manager in self._managers:
            await manager.on_probe_lost(conn)

    async def close(self) -> None:
        for manager in self._managers:
            await manager.close()
