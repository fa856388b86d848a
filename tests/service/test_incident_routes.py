"""/recorder, /stacks, /requests, the watchdog on /healthz and /metrics: the sidecar against real probes
in real processes (tests/fake_engine.py), over real sockets."""

import asyncio
import gzip
import json
import time

from sidecar.service.channel.queries import QueryBroker

from test_service import engines, settings, sidecar, wait_processes  # noqa: F401 (fixtures)


async def _get_json(client, path, **params):
    resp = await client.get(path, params=params)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_recorder_returns_the_recent_steps_of_each_process(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--steps-then-idle", "30")
    engines(client.url, "api_server")
    await wait_processes(client, 2)
    await asyncio.sleep(1.0)  # 30 steps of 2 ms, then idle
    body = await _get_json(client, "/recorder", seconds="60")
    by_role = {p["process"]["role"]: p for p in body["processes"]}
    worker = by_role["worker"]
    assert worker["error"] is None
    working = [s for s in worker["steps"] if s["working"]]
    assert len(working) == 30
    assert [s["step"] for s in working] == list(range(1, 31))
    assert all(s["batch"] == 4 and s["tokens"] == 16 and s["decode_tokens"] == 4 for s in working)
    assert all(s["end_ns"] >= s["start_ns"] for s in working)
    assert body["until_ns"] - body["since_ns"] == 60 * 10**9
    assert by_role["api_server"]["error"] is None and by_role["api_server"]["steps"] == []
    # The same as a Chrome trace: one slice per step of the worker.
    trace = await _get_json(client, "/recorder", seconds="60", format="trace")
    names = [e["name"] for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("step ")]
    assert len(names) == 30


async def test_recorder_is_gzip_compressed_for_clients_that_accept_it(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--step-ms", "0.2")
    await wait_processes(client, 1)
    await asyncio.sleep(2.0)
    resp = await client.get("/recorder", params={"seconds": "60"}, headers={"Accept-Encoding": "gzip"},
                            auto_decompress=False)
    assert resp.status == 200
    raw = await resp.read()
    if resp.headers.get("Content-Encoding") == "gzip":
        body = json.loads(gzip.decompress(raw))
    else:  # small enough to go uncompressed
        body = json.loads(raw)
    assert len(body["processes"][0]["steps"]) > 100


async def test_stacks_show_a_step_thread_blocked_in_a_step_and_the_watchdog_reports_it(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--hang-at-step", "5", env={"SIDECAR_WATCHDOG_S": "1"})
    await wait_processes(client, 1)
    await asyncio.sleep(0.5)
    t0 = time.monotonic()
    body = await _get_json(client, "/stacks")
    assert time.monotonic() - t0 < 2.0
    (proc,) = body["processes"]
    step_thread = next(t for t in proc["threads"] if t["step_thread"])
    assert any(f["function"] == "hang_inside_a_step" and f["file"].endswith("fake_engine.py")
               for f in step_thread["frames"]), step_thread
    text = await (await client.get("/stacks", params={"format": "text"})).text()
    assert "hang_inside_a_step" in text and "step thread" in text
    # The watchdog (1 s) fires at a heartbeat (every 2 s): /healthz and /metrics say so.
    for _ in range(60):
        health = await _get_json(client, "/healthz")
        if health["stuck"]:
            break
        await asyncio.sleep(0.1)
    (stuck,) = health["stuck"]
    assert stuck["step"] == 5 and stuck["age_s"] >= 1.0 and "worker" in stuck["process"]
    metrics = await (await client.get("/metrics")).text()
    line = next(l for l in metrics.splitlines() if l.startswith("sidecar_engine_step_stuck{"))
    assert line.endswith(" 1.0")
    running = next(l for l in metrics.splitlines() if l.startswith("sidecar_engine_step_running_seconds{"))
    assert float(running.rsplit(" ", 1)[1]) >= 1.0
    # The recorder shows the step still open.
    recorder = await _get_json(client, "/recorder", seconds="60")
    assert recorder["processes"][0]["open_step"]["age_ms"] >= 1000


async def test_stacks_sampling_as_speedscope(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--hang-at-step", "2")
    await wait_processes(client, 1)
    await asyncio.sleep(0.5)
    body = await _get_json(client, "/stacks", seconds="0.5", hz="100", format="speedscope", threads="step")
    frames = body["shared"]["frames"]
    (profile,) = body["profiles"]
    assert sum(profile["weights"]) >= 20
    top = max(zip(profile["weights"], profile["samples"]))[1]
    # Frames are outermost first: the step thread waits inside hang_inside_a_step.
    assert any(frames[i]["name"].startswith("hang_inside_a_step") and frames[i]["file"].endswith("fake_engine.py")
               for i in top), [frames[i]["name"] for i in top]


async def test_requests_lists_what_the_processes_know(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    body = await _get_json(client, "/requests")
    assert body["count"] == 0 and body["requests"] == []
    assert body["processes"][0]["knows_requests"] is False and body["processes"][0]["error"] is None


async def test_bad_parameters_are_400_naming_them(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    for path, params, param in [
        ("/recorder", {"seconds": "-1"}, "seconds"),
        ("/recorder", {"seconds": "1e9"}, "seconds"),
        ("/recorder", {"format": "xml"}, "format"),
        ("/recorder", {"processes": "gpu"}, "processes"),
        ("/recorder", {"bogus": "1"}, "bogus"),
        ("/stacks", {"seconds": "61"}, "seconds"),
        ("/stacks", {"hz": "50"}, "hz"),
        ("/stacks", {"seconds": "1", "hz": "0"}, "hz"),
        ("/stacks", {"format": "speedscope"}, "format"),
        ("/stacks", {"mode": "gdb"}, "mode"),
        ("/requests", {"x": "1"}, "x"),
    ]:
        resp = await client.get(path, params=params)
        body = await resp.json()
        assert resp.status == 400 and body["param"] == param, (path, params, body)


async def test_no_engine_processes_is_503(sidecar):
    client = await sidecar()
    for path in ("/recorder", "/stacks", "/requests"):
        resp = await client.get(path)
        assert resp.status == 503 and (await resp.json())["error"] == "no_engine_processes"


async def test_a_process_that_does_not_answer_is_named_and_the_others_still_shown():
    class Conn:
        def __init__(self, conn_id, answers):
            self.id, self.answers, self.sent = conn_id, answers, []

        async def send(self, msg):
            self.sent.append(msg)
            return self.answers

    broker = QueryBroker()
    mute, gone = Conn(1, True), Conn(2, False)
    t0 = time.monotonic()
    replies = await broker.ask([mute, gone], {"kind": "stacks"}, timeout_s=0.3)
    assert time.monotonic() - t0 < 1.0
    assert [r.error for r in replies] == ["no answer within 0.3 s", "the process could not be reached"]
    assert mute.sent[0].kind == "stacks" and not broker._pending


async def test_native_stacks_without_py_spy_say_so(sidecar, engines, monkeypatch):
    from sidecar.stacks import native as native_stacks

    monkeypatch.setattr(native_stacks.shutil, "which", lambda name: None)
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    resp = await client.get("/stacks", params={"mode": "native"})
    body = await resp.json()
    assert resp.status == 501 and body["error"] == "native_stacks_unavailable" and "pip install py-spy" in body["message"]
    resp = await client.get("/stacks", params={"mode": "native", "seconds": "1"})
    assert resp.status == 400 and (await resp.json())["param"] == "mode"


async def test_native_stacks_name_a_process_py_spy_cannot_read(sidecar, engines, monkeypatch, tmp_path):
    """py-spy present but refused (no ptrace permission): every process named with py-spy's own reason."""
    from sidecar.stacks import native as native_stacks

    fake = tmp_path / "py-spy"
    fake.write_text("#!/bin/sh\necho 'Permission Denied: Try running again with elevated permissions' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(native_stacks.shutil, "which", lambda name: str(fake))
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    resp = await client.get("/stacks", params={"mode": "native"})
    body = await resp.json()
    assert resp.status == 501 and "Permission Denied" in body["message"] and "ptrace" in body["message"]


async def test_native_stacks_show_the_native_frames_under_a_blocked_step(sidecar, engines, monkeypatch):
    """With py-spy (a test dependency) and ptrace allowed, as on this host: every process's threads, native
    frames included, the blocked step's Python frame among them."""
    import os
    import sys

    # py-spy is installed beside this Python (the venv's bin), which the sidecar's PATH may not list.
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--hang-at-step", "3")
    await wait_processes(client, 1)
    await asyncio.sleep(0.5)
    resp = await client.get("/stacks", params={"mode": "native"})
    assert resp.status == 200, await resp.text()
    (proc,) = (await resp.json())["processes"]
    assert proc["error"] is None
    names = [f["name"] for t in proc["threads"] for f in t["frames"]]
    assert "hang_inside_a_step" in names, names
    assert any(not f.get("filename", "").endswith(".py") for t in proc["threads"] for f in t["frames"])  # native ones
    text = await (await client.get("/stacks", params={"mode": "native", "format": "text"})).text()
    assert "hang_inside_a_step" in text


async def test_requests_takes_no_processes_filter_rather_than_ignore_one(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    resp = await client.get("/requests", params={"processes": "worker"})
    assert resp.status == 400 and (await resp.json())["param"] == "processes"
