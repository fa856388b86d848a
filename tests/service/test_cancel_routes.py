"""A stop before any step, through the HTTP API (issue #10, defect 8): the stop's answer, the job's
JSON and the sidecar's own metrics say ``cancelled``; no trace is offered.

The probes are stand-ins on the app's registry that answer as real ones do: "armed" at arm (an API
server's window opens there, "capturing"), and at a stop an armed step-driven probe ends at once
with "failed" (sidecar/common/step_window.py) while the API server's window exports a raw file."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from sidecar.common.protocol import Arm, Begin, CaptureReport, Stop, SyncArm, SyncReport, Verdict
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.routes.keys import JOBS, REGISTRY

from service_fakes import FakeWebSocket, identity, until

CANCELLED_REASON = "cancelled by the user before any step was recorded"


class AnsweringProbe(FakeWebSocket):
    def __init__(self, app, role: str, rank: int | None, probe_root: Path) -> None:
        super().__init__()
        self._app, self._root = app, probe_root
        self._tasks: set[asyncio.Task] = set()
        self._report: dict[str, type] = {}  # job id -> the report type of its kind
        self.raw: Path | None = None
        self.conn = app[REGISTRY].add(identity(role, rank), self)

    async def send_str(self, text: str) -> None:
        await super().send_str(text)
        msg = self.sent[-1]
        if isinstance(msg, (Arm, SyncArm)):
            kind = self._report[msg.spec.id] = CaptureReport if isinstance(msg, Arm) else SyncReport
            self._answer(kind, msg.spec.id, "armed" if self.conn.identity.step_driven else "capturing", steps_seen=100)
        elif isinstance(msg, Stop) and (kind := self._report.pop(msg.job_id, None)) is not None:
            if self.conn.identity.step_driven:
                self._answer(kind, msg.job_id, "failed", error=f"no step recorded before the job ended ({msg.reason})")
            else:
                self.raw = self._root / "captures" / msg.job_id / "raw" / "api.json"
                self.raw.parent.mkdir(parents=True)
                self.raw.write_text('{"traceEvents": []}')
                self._answer(kind, msg.job_id, "exporting")
                self._answer(kind, msg.job_id, "done", file=str(self.raw), bytes=19)

    def _answer(self, kind: type, job_id: str, state: str, **fields) -> None:
        # After the send returns, as a report that crosses the network would.
        report = kind(job_id=job_id, state=state, **fields)
        task = asyncio.get_running_loop().create_task(self._app[JOBS].on_report(self.conn, report))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@pytest.fixture
async def sidecar(aiohttp_client, tmp_path):
    app = make_app(ServiceSettings(trace_dir=tmp_path / "traces", probe_token="t", http_token=None, max_steps=50,
                                   max_capture_bytes=1 << 30, keep=20, stop_grace_s=2.0))
    client = await aiohttp_client(app)
    return client, app


def metric(text: str, name: str, state: str) -> float:
    line = next((l for l in text.splitlines() if l.startswith(f'{name}{{state="{state}"}}')), None)
    return float(line.rsplit(" ", 1)[1]) if line else 0.0


async def test_a_capture_stopped_before_its_start_step_is_cancelled(sidecar, tmp_path):
    client, app = sidecar
    worker = AnsweringProbe(app, "worker", 0, tmp_path / "probe-root")
    api = AnsweringProbe(app, "api_server", None, tmp_path / "probe-root")
    started = await (await client.post("/profile/start", params={"steps": "5"})).json()
    await until(lambda: any(isinstance(m, Begin) for m in worker.sent))
    status = await (await client.get(started["url"])).json()
    assert status["state"] == "armed", "the API server's window is open, but no step is recorded yet"

    stopped = await client.post("/profile/stop")
    assert stopped.status == 200
    assert (await stopped.json())["state"] == "cancelled"
    status = await (await client.get(started["url"])).json()
    assert status["state"] == "cancelled" and status["reason"] == CANCELLED_REASON
    assert status["trace"] is None and status["summary"] is None and status["headline"] is None
    assert status["files"] == {}
    assert api.raw is not None and not api.raw.exists()
    assert (await client.get(f"{started['url']}/trace")).status == 404
    metrics = await (await client.get("/metrics")).text()
    assert metric(metrics, "sidecar_captures_total", "cancelled") == 1.0
    assert metric(metrics, "sidecar_captures_total", "failed") == 0.0
    assert (await client.post("/profile/stop")).status == 409
    # Both processes are told over their channel: the API server's capture span says cancelled.
    await until(lambda: all(any(isinstance(m, Verdict) for m in p.sent) for p in (worker, api)))
    told = next(m for m in api.sent if isinstance(m, Verdict))
    assert (told.state, told.reason, told.trace, told.steps) == ("cancelled", CANCELLED_REASON, None, 0)


async def test_a_capture_on_a_full_disk_is_refused_with_507(sidecar, tmp_path, monkeypatch):
    from collections import namedtuple

    from sidecar.service.export import disk_space

    client, app = sidecar
    AnsweringProbe(app, "worker", 0, tmp_path / "probe-root")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda _p: usage(1 << 30, 1 << 30, 5 << 20))
    refused = await client.post("/profile/start", params={"steps": "5"})
    assert refused.status == 507
    body = await refused.json()
    assert body["error"] == "insufficient_storage" and "no space left on device" in body["message"]
    assert (await client.get("/profiles")).status == 200
    assert (await (await client.get("/profiles")).json())["captures"] == []


async def test_a_scan_stopped_before_its_start_step_is_cancelled(sidecar, tmp_path):
    client, app = sidecar
    worker = AnsweringProbe(app, "worker", 0, tmp_path / "probe-root")
    started = await (await client.post("/sync/start", params={"steps": "3"})).json()
    await until(lambda: any(isinstance(m, Begin) for m in worker.sent))
    stopped = await client.post("/sync/stop")
    assert stopped.status == 200 and (await stopped.json())["state"] == "cancelled"
    result = await (await client.get(started["url"])).json()
    assert result["state"] == "cancelled" and result["reason"] == CANCELLED_REASON
    metrics = await (await client.get("/metrics")).text()
    assert metric(metrics, "sidecar_sync_scans_total", "cancelled") == 1.0
