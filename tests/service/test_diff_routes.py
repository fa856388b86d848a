"""``GET /profile/{a}/diff/{b}`` (issue #13): two finished captures' summaries diffed, as JSON or text;
an unknown capture is a 404 naming it, one without a summary a 409; and ``sidecar diff ID ID`` through
a running sidecar. Finished captures are written to the trace dir as a sidecar leaves them (capture.json
and summary.json), so the app lists them at start (capture_index.py)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from sidecar.analysis import analyze_path
from sidecar.common.protocol import CaptureReport
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.routes.keys import JOBS, REGISTRY

from service_fakes import FakeWebSocket, identity

REPO = Path(__file__).resolve().parents[2]
BEFORE, AFTER, NO_SUMMARY = "20261123-100000-aaaaaa", "20261123-100500-bbbbbb", "20261123-101000-cccccc"
UNKNOWN = "20261123-120000-dddddd"


def settings(tmp_path) -> ServiceSettings:
    return ServiceSettings(trace_dir=tmp_path / "traces", probe_token="probe-token-for-these-tests", http_token=None,
                           max_steps=50, max_capture_bytes=1 << 30, keep=20, stop_grace_s=0.3)


def kineto(gemm_us: float) -> dict:
    """Four steps of one launched gemm kernel each; the walls jitter by 0.5 %."""
    events = []
    for n in range(4):
        ts = n * 1000.0
        events += [
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": 7, "tid": 7, "ts": ts,
             "dur": 1000.0 + 5 * (n % 2)},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": ts + 1, "dur": 2.0,
             "args": {"correlation": n + 1}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": ts + 10, "dur": gemm_us,
             "args": {"device": 0, "stream": 7, "correlation": n + 1}},
        ]
    return {"schemaVersion": 1, "traceEvents": events}


def finished_capture(trace_dir: Path, capture_id: str, gemm_us: float | None) -> Path:
    """A capture's folder as the sidecar leaves it when done: capture.json, and summary.json unless
    ``gemm_us`` is None (a failed capture, no trace)."""
    folder = trace_dir / "captures" / capture_id
    folder.mkdir(parents=True)
    summary = None
    if gemm_us is not None:
        (folder / "raw.json").write_text(json.dumps(kineto(gemm_us)))
        (folder / "summary.json").write_text(json.dumps(analyze_path(folder / "raw.json")))
        (folder / "raw.json").unlink()
        summary = f"/profile/{capture_id}/summary"
    state = "done" if summary else "failed"
    (folder / "capture.json").write_text(json.dumps({
        "id": capture_id, "state": state, "reason": None if summary else "no process recorded a step",
        "steps": 4, "delay": 0, "created_at": 1.0, "finished_at": 2.0, "headline": None, "summary": summary,
        "trace": None, "processes": [], "options": {}}))
    return folder


@pytest.fixture
async def client(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    finished_capture(trace_dir, BEFORE, 400)
    finished_capture(trace_dir, AFTER, 100)
    finished_capture(trace_dir, NO_SUMMARY, None)
    app = make_app(settings(tmp_path))
    client = await aiohttp_client(app)
    client.trace_dir = trace_dir
    return client


async def test_the_diff_of_two_captures(client):
    resp = await client.get(f"/profile/{BEFORE}/diff/{AFTER}")
    assert resp.status == 200, await resp.text()
    diff = await resp.json()
    assert diff["schema_version"] == 1 and diff["basis"] == "per_step"
    assert diff["a"]["steps"] == diff["b"]["steps"] == 4
    gemm = diff["kernels"][0]
    assert (gemm["name"], gemm["a_us"], gemm["b_us"], gemm["delta_us"], gemm["ratio"], gemm["noise"]) == \
        ("gemm", 400, 100, -300, 0.25, False)
    same = await (await client.get(f"/profile/{BEFORE}/diff/{BEFORE}")).json()
    assert all(r["noise"] and r["delta"] == 0 for r in same["overall"])
    assert all(r["noise"] and r["delta_us"] == 0 for r in same["kernels"])


async def test_the_text_is_what_sidecar_diff_prints(client):
    resp = await client.get(f"/profile/{BEFORE}/diff/{AFTER}?format=text")
    assert resp.status == 200 and resp.content_type == "text/plain"
    text = await resp.text()
    assert "Overall, per step" in text and "×0.25" in text and "GPU idle gaps by cause, per step" in text


async def test_an_unknown_capture_is_a_404_naming_it(client):
    for path, named in ((f"/profile/{UNKNOWN}/diff/{AFTER}", UNKNOWN), (f"/profile/{BEFORE}/diff/nope", "nope")):
        resp = await client.get(path)
        assert resp.status == 404
        body = await resp.json()
        assert body["error"] == "not_found" and repr(named) in body["message"]


async def test_a_capture_without_a_summary_is_a_409(client):
    resp = await client.get(f"/profile/{BEFORE}/diff/{NO_SUMMARY}")
    assert resp.status == 409
    body = await resp.json()
    assert body["error"] == "conflict" and NO_SUMMARY in body["message"] and "no summary" in body["message"]


async def test_a_capture_still_running_is_a_409(client):
    app = client.server.app
    conn = app[REGISTRY].add(identity("worker", 0), FakeWebSocket())
    start = await client.post("/profile/start?steps=1")
    assert start.status == 202, await start.text()
    running = (await start.json())["id"]
    await app[JOBS].on_report(conn, CaptureReport(job_id=running, state="armed", steps_seen=0))
    resp = await client.get(f"/profile/{running}/diff/{AFTER}")
    assert resp.status == 409
    body = await resp.json()
    assert "is armed" in body["message"] and "not ready" in body["message"]
    assert (await client.post("/profile/stop")).status == 200


async def test_a_removed_summary_is_a_410(client):
    (client.trace_dir / "captures" / AFTER / "summary.json").unlink()
    resp = await client.get(f"/profile/{BEFORE}/diff/{AFTER}")
    assert resp.status == 410 and (await resp.json())["error"] == "gone"


async def test_a_bad_format_or_parameter_is_a_400(client):
    for query, param in (("format=html", "format"), ("colour=1", "colour")):
        resp = await client.get(f"/profile/{BEFORE}/diff/{AFTER}?{query}")
        assert resp.status == 400
        body = await resp.json()
        assert body["error"] == "bad_parameter" and body["param"] == param


async def _cli(*args: str) -> tuple[int, str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    env.pop("SIDECAR_TOKEN", None)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "sidecar.cli", "diff", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode, out.decode(), err.decode()


async def test_sidecar_diff_of_capture_ids(client, tmp_path):
    url = str(client.make_url("")).rstrip("/")
    code, out, err = await _cli(BEFORE, AFTER, "--url", url, "--json")
    assert code == 0, err
    assert json.loads(out)["kernels"][0]["ratio"] == 0.25
    # A capture against a trace file: the file is analysed here, the capture's summary fetched.
    trace = tmp_path / "after.json"
    trace.write_text(json.dumps(kineto(100)))
    code, out, err = await _cli(BEFORE, str(trace), "--url", url)
    assert code == 0, err
    assert f"B: {trace}" in out and "×0.25" in out
    code, out, err = await _cli(BEFORE, UNKNOWN, "--url", url)
    assert code == 2 and out == ""
    assert err == f"sidecar diff: HTTP 404: no capture {UNKNOWN!r} (see /profiles)\n"
