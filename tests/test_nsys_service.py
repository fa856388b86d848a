"""``backend=nsys`` through the HTTP API, with stand-in probes on the app's registry (tests/service): the
parameters it refuses beside it, the processes it takes (step-driven ones with CUDA; the others named in
the notes), the spec the probes get, and a capture that ends ``done`` with no trace, saying where nsys
writes its report."""

from __future__ import annotations

import asyncio

import pytest

from service.service_fakes import FakeWebSocket, identity, until
from sidecar.common.protocol import Arm, Begin, CaptureReport
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.jobs.params import ParamError, parse_capture_request
from sidecar.service.routes.keys import CAPTURES, JOBS, REGISTRY

NSYS_DONE = {"cuda_profiler": True, "step_ranges": 3, "phase_ranges": True}


class NsysProbe(FakeWebSocket):
    """Answers an nsys capture as capture/nsys.py does: armed, capturing at the start step, done with no file."""

    def __init__(self, app, role: str, rank: int | None = None, cuda: bool = True) -> None:
        super().__init__()
        self._app = app
        self._tasks: set[asyncio.Task] = set()
        self.conn = app[REGISTRY].add(identity(role, rank, cuda=cuda), self)

    async def send_str(self, text: str) -> None:
        await super().send_str(text)
        msg = self.sent[-1]
        if isinstance(msg, Arm):
            self._answer(msg.spec.id, "armed", steps_seen=40)
        elif isinstance(msg, Begin):
            self._answer(msg.job_id, "capturing", first_step=msg.start_step)
            self._answer(msg.job_id, "exporting", steps_recorded=3)
            self._answer(msg.job_id, "done", steps_recorded=3, first_step=msg.start_step, nsys=NSYS_DONE)

    def _answer(self, job_id: str, state: str, **fields) -> None:
        report = CaptureReport(job_id=job_id, state=state, **fields)
        task = asyncio.get_running_loop().create_task(self._app[JOBS].on_report(self.conn, report))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


@pytest.fixture
async def sidecar(aiohttp_client, tmp_path):
    app = make_app(ServiceSettings(trace_dir=tmp_path / "traces", probe_token="t", http_token=None, max_steps=50,
                                   max_capture_bytes=1 << 30, keep=20, stop_grace_s=2.0))
    return await aiohttp_client(app), app


@pytest.mark.parametrize("params, named", [
    ({"record_shapes": "true"}, "record_shapes"), ({"with_modules": "true"}, "with_modules"),
    ({"stacks": "sampled"}, "stacks"), ({"with_stack": "true"}, "with_stack"), ({"activities": "cuda"}, "activities"),
    ({"profile_memory": "1"}, "profile_memory"), ({"with_flops": "yes"}, "with_flops"),
])
def test_torch_profiler_options_are_refused_beside_nsys(params, named):
    with pytest.raises(ParamError) as refused:
        parse_capture_request({"steps": "3", "backend": "nsys", **params}, max_steps=50)
    assert refused.value.param == named and "backend=nsys" in refused.value.message


def test_backend_values():
    assert parse_capture_request({"steps": "3"}, 50).backend == "torch"
    # What a form sends for options left off is no contradiction.
    request = parse_capture_request({"steps": "3", "backend": "NSYS", "stacks": "none", "record_shapes": "false"}, 50)
    assert request.backend == "nsys"
    with pytest.raises(ParamError) as refused:
        parse_capture_request({"steps": "3", "backend": "ncu"}, 50)
    assert refused.value.param == "backend" and "torch, nsys" in refused.value.message


async def test_nsys_without_a_cuda_process_is_a_400_naming_them(sidecar):
    client, app = sidecar
    NsysProbe(app, "engine_core", cuda=False)
    NsysProbe(app, "worker", 0, cuda=False)
    refused = await client.post("/profile/start", params={"steps": "3", "backend": "nsys"})
    assert refused.status == 400
    body = await refused.json()
    assert body["param"] == "backend" and "no CUDA" in body["message"] and "worker rank 0" in body["message"]


async def test_an_nsys_capture_runs_in_the_cuda_processes_and_ends_done_without_a_trace(sidecar):
    client, app = sidecar
    worker = NsysProbe(app, "worker", 0)
    core = NsysProbe(app, "engine_core", cuda=False)
    api = NsysProbe(app, "api_server")
    started = await client.post("/profile/start", params={"steps": "3", "backend": "nsys"})
    assert started.status == 202, await started.text()
    body = await started.json()
    [arm] = [m for m in worker.sent if isinstance(m, Arm)]
    assert arm.spec.backend == "nsys" and arm.spec.steps == 3
    assert not core.sent and not api.sent  # left out: never armed

    async def final():
        status = await (await client.get(body["url"])).json()
        return status if status["state"] not in ("armed", "capturing", "exporting") else None

    await until(lambda: app[CAPTURES].active is None)
    status = await final()
    assert status["state"] == "done", status
    assert status["backend"] == "nsys" and status["options"]["backend"] == "nsys"
    assert "nsys" in status["nsys"]["report"] and "-o" in status["nsys"]["report"]
    assert status["trace"] is None and status["summary"] is None and status["files"] == {}
    [process] = status["processes"]
    assert process["role"] == "worker" and process["steps_recorded"] == 3 and process["nsys"] == NSYS_DONE
    notes = " | ".join(status["notes"])
    assert "engine core" in notes.lower() and "no CUDA" in notes and "no steps to mark" in notes
    # Read back as a restarted sidecar would: still an nsys capture.
    listed = await (await client.get("/profiles")).json()
    assert listed["captures"][0]["backend"] == "nsys"
