"""Stand-ins for the service's unit tests: probe connections whose websocket records the typed
messages the sidecar sends, and a registry, job board and both managers wired as in ``make_app``."""

from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from sidecar.engine import STANDARD_ROLES
from sidecar.common.protocol import CaptureReport, ProcessIdentity, SyncReport
from sidecar.common.protocol_codec import decode_from_sidecar
from sidecar.service.jobs.captures import CaptureManager
from sidecar.service.jobs.board import JobBoard
from sidecar.service.channel.registry import ProbeConnection, ProbeRegistry
from sidecar.service.jobs.scans import ScanManager

_ROLES = {r.name: r for r in STANDARD_ROLES}
_pids = itertools.count(1000)


class FakeWebSocket:
    """Decodes what the sidecar sends, as a probe would, so only valid protocol messages pass."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.reachable = True
        self.send_delay_s = 0.0  # > 0: the send yields to the event loop, as a real one may

    async def send_str(self, text: str) -> None:
        if self.send_delay_s:
            await asyncio.sleep(self.send_delay_s)
        if not self.reachable:
            raise ConnectionResetError("probe gone")
        self.sent.append(decode_from_sidecar(text))

    async def close(self) -> None:
        self.reachable = False


def identity(role: str, rank: int | None = None, *, step_driven: bool | None = None, label: str | None = None,
             cuda: bool = False) -> ProcessIdentity:
    known = _ROLES.get(role)
    return ProcessIdentity(
        role=role, role_label=label or (known.label if known else role),
        step_driven=known.step_driven if step_driven is None else step_driven,
        pid=next(_pids), rank=rank, host="test", cuda=cuda, engine="fake 1.0",
    )


class World:
    """A sidecar without HTTP: registry, job board, capture and scan managers."""

    def __init__(self, tmp_path: Path, *, keep: int = 20, grace_s: float = 0.3, arm_reply_s: float = 0.3,
                 min_free_bytes: int = 0) -> None:
        """``min_free_bytes``: the capture manager's free-space floor (0: a test's disk is never too full)."""
        self.registry = ProbeRegistry()
        self.board = JobBoard()
        self.executor = ThreadPoolExecutor(max_workers=1)
        self.finished: list[Any] = []
        self.trace_dir = tmp_path / "traces"
        self.captures = CaptureManager(
            self.registry, self.board, self.trace_dir, self.executor, max_capture_bytes=1 << 30, keep=keep,
            stop_grace_s=grace_s,
            arm_reply_s=arm_reply_s, on_finished=self.finished.append, min_free_bytes=min_free_bytes,
        )
        self.scans = ScanManager(self.registry, self.board, self.trace_dir / "scans", keep=keep, stop_grace_s=grace_s,
                                 arm_reply_s=arm_reply_s, on_finished=self.finished.append)

    def connect(self, role: str, rank: int | None = None, **kwargs: Any) -> ProbeConnection:
        return self.registry.add(identity(role, rank, **kwargs), FakeWebSocket())

    async def capture_report(self, conn: ProbeConnection, job_id: str, state: str, **fields: Any) -> None:
        await self.board.on_report(conn, CaptureReport(job_id=job_id, state=state, **fields))

    async def sync_report(self, conn: ProbeConnection, job_id: str, state: str, **fields: Any) -> None:
        await self.board.on_report(conn, SyncReport(job_id=job_id, state=state, **fields))

    async def close(self) -> None:
        await self.board.close()
        self.executor.shutdown(wait=True)


def sent(conn: ProbeConnection, kind: type | None = None) -> list[Any]:
    return [m for m in conn.ws.sent if kind is None or isinstance(m, kind)]


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")
