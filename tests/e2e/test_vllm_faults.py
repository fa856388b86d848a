"""Issue 10 fault injection on real vLLM: each fault under streaming load, each asserting that no
client request failed and that what the sidecar says afterwards is true.

- A port squatter on the sidecar's port while the sidecar is down: the probes connect to it and give
  it nothing (no token in any form, nothing after their hello), act on none of its commands (no file
  where it asked, nothing under the trace root); the real sidecar, back, captures as before.
- The sidecar SIGKILLed in the middle of a capture, then restarted: the capture is listed as
  interrupted, and a new one starts within seconds of the sidecar answering and ends ``done``.
- The OTLP trace backend down (connection refused) for a while under load: the API server's memory
  stays bounded (its span queue, 16 spans here, fills and drops), the spans it could not export are
  counted on the sidecar's ``/metrics``, and spans arrive again once a backend listens there.

The first two share the session's ``vllm_stack`` and leave it as they found it: its sidecar running,
the three processes connected. The third runs on the ``fault_stack`` (conftest.py: its environment
names the dead endpoint), which test_vllm_shutdown.py then ends.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import time
import urllib.request
from collections import Counter
from contextlib import contextmanager, suppress
from pathlib import Path

import aiohttp
import psutil
import pytest

from sidecar.cli.client import SidecarClient, SidecarError
from sidecar.devtools.traffic import stream_one
from sidecar.service.jobs.capture_index import INTERRUPTED
from sidecar_vllm.devtools import VllmStack

from fault_tools import Squatter, token_forms, tree
from relay import LoopThread, Relay

pytestmark = pytest.mark.vllm

ROLES = {"api_server", "engine_core", "worker"}


@contextmanager
def sidecar_restored(stack: VllmStack):
    """The shared stack leaves a test with its sidecar running, whatever happened in it."""
    try:
        yield
    finally:
        if stack._sidecar is None or stack._sidecar.poll() is not None:
            stack.start_sidecar()


def stack_token(stack: VllmStack) -> str:
    """The token the stack's probes present ($SIDECAR_TOKEN, else the token file, as in Stack._env)."""
    return os.environ.get("SIDECAR_TOKEN", "").strip() or (stack.work_dir / "token").read_text().strip()


def test_a_port_squatter_while_the_sidecar_is_down_gets_nothing(vllm_stack, background_load, tmp_path):
    client = SidecarClient(vllm_stack.sidecar_url)
    engine = {(p["role"], p["pid"]) for p in client.request("GET", "/processes")["processes"]}
    assert {role for role, _ in engine} == ROLES, engine
    token = stack_token(vllm_stack)
    # Where the squatter's commands ask the probes to write: outside the trace root, one of them beside it.
    targets = [tmp_path / "squatters-choice", vllm_stack.trace_dir.parent / "squatted"]
    squatter = Squatter(vllm_stack.sidecar_port, targets)
    with sidecar_restored(vllm_stack), background_load(vllm_stack, concurrency=4, duration_s=120) as load:
        time.sleep(1.5)
        vllm_stack.stop_sidecar(kill=True)
        before = tree(vllm_stack.trace_dir)
        loop = LoopThread()
        try:
            loop.run(squatter.start())
            # The probes retry with backoff (0.2 s doubling to 5 s) and push metrics every 5 s: until every
            # engine process has said hello and a push came, then 2 s for anything a probe would send or
            # write in answer to the commands that followed.
            deadline = time.monotonic() + 30
            while not (squatter.pushes and engine <= {(h["process"]["role"], h["process"]["pid"])
                                                      for h in squatter.hellos()}):
                assert time.monotonic() < deadline, f"in 30 s: {len(squatter.pushes)} pushes, hellos {squatter.hellos()}"
                time.sleep(0.2)
            time.sleep(2.0)
        finally:
            loop.run(squatter.stop())
            loop.close()
        after = tree(vllm_stack.trace_dir)

        vllm_stack.start_sidecar()
        vllm_stack.wait_for_processes(3, timeout=30)
        status = client.wait(client.start(3)["id"], timeout=60)
        load.stop()
    result = load.join()

    # The test exercised something: every engine process reached the squatter and said hello.
    hellos = squatter.hellos()
    print(f"squatter: {len(squatter.connections)} websocket connections, {len(squatter.pushes)} metric pushes, "
          f"{len(squatter.everything_received())} bytes")
    assert {(h["process"]["role"], h["process"]["pid"]) for h in hellos} >= engine, hellos
    assert all(h["type"] == "hello" and re.fullmatch(r"[0-9a-f]{64}", h["nonce"]) for h in hellos), hellos
    assert squatter.pushes, "no metric push reached the squatter (they come every 5 s)"
    # Nothing after the hello on any connection: no proof, no heartbeat, no report of a command.
    assert [frames for frames in squatter.connections if len(frames) > 1] == []
    # No token, in no form, anywhere in what it received; no credential header.
    received = squatter.everything_received()
    assert [form for form in token_forms(token) if form in received] == [], "the token reached the squatter"
    assert not any(k.lower() == "authorization" for h in squatter.headers for k in h)
    assert all("X-Sidecar-Signature" in h for h in squatter.headers if h.get("Content-Type") == "application/x-protobuf")
    # None of its commands was acted on: nothing where it asked, nothing new under the trace root (where
    # each probe touches its own marker, <root>/probes/<name>, before each hello: only its being there counts).
    assert [t for t in targets if t.exists()] == []
    before, after = (_markers_by_presence(t) for t in (before, after))
    assert after == before, {k: (before.get(k), after.get(k)) for k in set(before) | set(after)
                             if before.get(k) != after.get(k)}

    # The real sidecar, back, captures as before; the clients never noticed any of it.
    assert status["state"] == "done", status
    assert {p["role"] for p in status["processes"]} == ROLES
    assert len(result.results) > 8 and not result.failures, [r.error for r in result.failures][:3]


def _markers_by_presence(entries: dict[str, tuple]) -> dict[str, tuple]:
    return {path: entry[:1] if path.startswith("probes/") else entry for path, entry in entries.items()}


def test_sidecar_sigkilled_mid_capture_then_restarted(vllm_stack, background_load):
    client = SidecarClient(vllm_stack.sidecar_url)
    refusals: list[str] = []
    with sidecar_restored(vllm_stack), background_load(vllm_stack, concurrency=4, duration_s=150) as load:
        time.sleep(1.5)
        old = client.start(300, timeout_s=900)["id"]
        old_processes = {p["role"] for p in client.status(old)["processes"]}
        deadline = time.monotonic() + 30
        while client.status(old)["state"] != "capturing":
            assert time.monotonic() < deadline, "the capture never started recording"
            time.sleep(0.05)
        time.sleep(1.0)  # a few steps into the profiler
        killed_at = time.monotonic()
        vllm_stack.stop_sidecar(kill=True)
        vllm_stack.start_sidecar()  # returns once /healthz answers
        healthy_at = time.monotonic()
        while True:
            try:
                new = client.start(3, timeout_s=120)["id"]
                break
            except SidecarError as exc:  # 503 until a probe has reconnected
                refusals.append(f"{exc.status} {exc.body.get('error')}")
            assert time.monotonic() - healthy_at < 60, f"no capture accepted: {refusals[-5:]}"
            time.sleep(0.1)
        accepted_after_s = time.monotonic() - healthy_at
        print(f"sidecar answered {healthy_at - killed_at:.2f} s after the kill; a new capture accepted "
              f"{accepted_after_s:.2f} s after that; refused before: {refusals}")
        listed = {c["id"]: c for c in client.request("GET", "/profiles")["captures"]}
        old_status = client.status(old)  # 200, or SidecarError
        new_status = client.wait(new, timeout=120)
        load.stop()
    result = load.join()
    vllm_stack.wait_for_processes(3, timeout=30)  # the shared stack, as it was
    old_after = client.status(old)

    # The killed capture: listed, and what the capture index says of a capture the sidecar died in.
    assert old in listed, sorted(listed)
    for seen in (listed[old], old_status, old_after):  # late reports of its probes change nothing
        assert seen["state"] == "failed" and seen["reason"] == INTERRUPTED, seen
        assert seen["trace"] is None and seen["files"] == {}, seen
    # Its partial raw traces are deleted, even those the probes finished writing after the restart.
    old_dir = vllm_stack.trace_dir / "captures" / old
    assert sorted(p.name for p in old_dir.rglob("*")) == ["capture.json"], sorted(old_dir.rglob("*"))

    # A new capture, accepted within 5 s of /healthz, records what it selected (the processes
    # reconnected by then: the probes retry with backoff up to 5 s) to the end.
    assert accepted_after_s < 5, f"accepted {accepted_after_s:.1f} s after /healthz; refused: {refusals}"
    assert new_status["state"] == "done", (new_status, refusals)
    assert all(p["state"] == "done" for p in new_status["processes"]), new_status["processes"]
    assert len(result.results) > 8 and not result.failures, [r.error for r in result.failures][:3]

    # The interrupted capture's record still says what was asked of it, and which processes it had
    # (each lost when the sidecar stopped), as a capture.json that was not final would tell the index.
    assert (old_after["steps"], old_after["options"]["timeout_s"]) == (300, 900.0), old_after
    assert {p["role"] for p in old_after["processes"]} == old_processes == ROLES, old_after
    assert all(p["state"] == "lost" for p in old_after["processes"]), old_after


# -- the OTLP trace backend down -----------------------------------------------------------------------

# 20 s down is 3 of the OTLP exporter's export attempts (each retries with backoff, 1 + 2 + 4 s, until
# the next wait would pass its 10 s timeout, then its batch is dropped), long enough for the 16-span
# queue (conftest.py) to fill and drop under the load. Here 166 requests made 616 spans: 32 dropped
# by two failed exports, 584 by the full queue. With a 64-span queue a slow CI runner's load dropped
# 452 spans, every one by a failed export: the queue never filled.
OUTAGE_S = 20
RSS_SAMPLE_S = 2
RSS_BASELINE_S = 6
# Measured on a busy 2-core host under the 4-client load, a minute down (520-570 requests, 1800-2000
# spans dropped): the API server's RSS grew 3.8 and 7.0 MiB between the 10 s sample and the last (629 →
# 638-640 MiB over the whole minute). The export queue is bounded whatever the backend does.
RSS_GROWTH_LIMIT = 64 << 20
DROPPED = "sidecar_telemetry_spans_dropped_total"


def scrape(stack: VllmStack, name: str) -> list[tuple[dict[str, str], float]]:
    """The series of metric ``name`` on the sidecar's /metrics: (labels, value) each."""
    with urllib.request.urlopen(f"{stack.sidecar_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    out = []
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
            out.append((labels, float(match.group(2))))
    return out


def drops(stack: VllmStack) -> Counter:
    """Spans counted dropped so far, by (process role, reason)."""
    return Counter({(labels.get("sidecar_process_role"), labels.get("reason")): v for labels, v in scrape(stack, DROPPED)})


def settled_drops(stack: VllmStack, timeout_s: float = 30.0) -> Counter:
    """``drops`` once two reads 1.5 s apart agree (metrics are pushed every second): what an earlier
    test on the same stack left counted."""
    deadline = time.monotonic() + timeout_s
    last = None
    while (now := drops(stack)) != last:
        assert time.monotonic() < deadline, f"the drop counts never settled: {now}"
        last = now
        time.sleep(1.5)
    return now


def phoenix_available() -> bool:
    from telemetry.e2e import PHOENIX_VENV_PYTHON

    return Path(os.environ.get("PHOENIX_PYTHON") or PHOENIX_VENV_PYTHON).exists()


async def traced_requests(stack: VllmStack, n: int) -> set[str]:
    """``n`` streaming requests, each in a trace of the caller's; their trace ids."""
    trace_ids = [secrets.token_hex(16) for _ in range(n)]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        results = await asyncio.gather(*(
            stream_one(session, stack.server_url, stack.served_name, "the trace backend is back", 8,
                       headers={"traceparent": f"00-{t}-{secrets.token_hex(8)}-01"}) for t in trace_ids))
    assert all(r.ok for r in results), [r.error for r in results]
    return set(trace_ids)


def test_trace_backend_down_for_a_while(fault_stack, tmp_path, background_load):
    phoenix = relay = None
    loop = LoopThread()
    try:
        if phoenix_available():  # started now, ready by the end of the outage; nothing points at it yet
            from telemetry.e2e import Phoenix

            (tmp_path / "phoenix").mkdir()
            phoenix = Phoenix(tmp_path / "phoenix")
        stack = fault_stack.use()
        dead_port = stack.dead_port  # nothing listens there: every export is refused
        api_pid = next(p["pid"] for p in SidecarClient(stack.sidecar_url).request("GET", "/processes")["processes"]
                       if p["role"] == "api_server")
        api = psutil.Process(api_pid)
        before = settled_drops(stack)
        rss: list[tuple[float, int]] = []
        with background_load(stack, concurrency=4, duration_s=OUTAGE_S) as load:
            started = time.monotonic()
            while time.monotonic() - started < OUTAGE_S:
                rss.append((time.monotonic() - started, api.memory_info().rss))
                time.sleep(RSS_SAMPLE_S)
            rss.append((time.monotonic() - started, api.memory_info().rss))
        result = load.join()
        assert len(result.results) > 20 and not result.failures, [r.error for r in result.failures][:3]

        baseline = next(value for t, value in rss if t >= RSS_BASELINE_S)
        growth = rss[-1][1] - baseline
        print(f"API server RSS (s, MiB): {[(round(t), round(v / 2**20, 1)) for t, v in rss]}; "
              f"growth after {RSS_BASELINE_S} s: {growth / 2**20:.1f} MiB")
        assert growth < RSS_GROWTH_LIMIT, f"API server RSS grew {growth / 2**20:.1f} MiB during the outage"

        # Counted: every request made at least its own span, and none could be exported, so once the
        # last failed exports are over (an export retries for up to 10 s), the drops reach the requests.
        # (Counted from here on: drops before the outage, of an earlier test on this stack, are not its.)
        load_ended = time.monotonic()
        while (dropped := sum((drops(stack) - before).values())) < len(result.results):
            assert time.monotonic() - load_ended < 45, f"{dropped:.0f} spans counted dropped for {len(result.results)} requests"
            time.sleep(1)
        by = dict(drops(stack) - before)
        print(f"{len(result.results)} requests; spans dropped (role, reason): {by}, "
              f"counted {time.monotonic() - load_ended:.1f} s after the load")
        assert sum(v for (role, _), v in by.items() if role == "api_server") >= len(result.results), by
        assert by.get(("api_server", "export_failed"), 0) > 0, by
        assert by.get(("api_server", "queue_full"), 0) > 0, by  # the bound was reached, and held

        # The backend is back on the port the engine was given: spans arrive again. Phoenix picks its
        # own ports, so a relay on the dead port forwards to it (as a collector restarted behind it).
        if phoenix is not None:
            phoenix.wait_ready(timeout_s=90)
            relay = loop.run(Relay(dead_port, phoenix.http_port).start())
            assert relay.port == dead_port
            t0 = time.monotonic()
            trace_ids = asyncio.run(traced_requests(stack, 3))
            deadline = time.monotonic() + 60
            while not trace_ids <= {s.trace_id for s in phoenix.spans()}:
                assert time.monotonic() < deadline, "no span of the requests sent after the recovery reached the backend"
                time.sleep(1)
            print(f"recovered in {time.monotonic() - t0:.1f} s")
    finally:
        if relay is not None:  # the backend is dead again for the next test on this stack
            loop.run(relay.stop())
        loop.close()
        if phoenix is not None:
            phoenix.stop()
