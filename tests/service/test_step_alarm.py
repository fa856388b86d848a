"""The step alarm on the sidecar's side (issue 30): the lowest single-event step threshold, kept by the
registry and sent to each probe that asks (``hello.step_alarm``) after its handshake and on every
change; and end to end, a single-event rule firing within a second of the slow step's end."""

from __future__ import annotations

import asyncio
import threading
import time

from aiohttp import web

from sidecar.common import auth
from sidecar.common.protocol import PROBE_WS_PATH, Challenge, ClockProbe, Hello, Proof, StepAlarm
from sidecar.common.protocol_codec import PROTOCOL_VERSION, decode_from_sidecar, encode
from sidecar.probe import Probe, link
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.channel.registry import ProbeRegistry
from sidecar.service.incidents.step_alarm import lowest_step_threshold
from sidecar.service.incidents.trigger_rules import parse_rule
from sidecar.service.incidents.triggers import Trigger
from sidecar.service.incidents.trigger_limits import FiringLimits
from sidecar.service.routes.keys import REGISTRY
from service_fakes import FakeWebSocket, identity
from test_service import engines, sidecar, wait_processes  # noqa: F401 (fixtures)

TOKEN = "step-alarm-token"


def trigger(body: dict) -> Trigger:
    rule = parse_rule(body, 50)
    return Trigger(id="trg-x", rule=rule, limits=FiringLimits(rule.cooldown_s, rule.budget_per_hour))


def test_the_lowest_single_event_threshold():
    assert lowest_step_threshold([]) is None
    rules = [trigger({"metric": "step_duration", "threshold_ms": 800}),
             trigger({"metric": "step_duration", "threshold_ms": 250.5}),
             # A percentile rule is evaluated on metrics pushes, never on one step: not the alarm's.
             trigger({"metric": "step_duration", "threshold_ms": 10, "percentile": 99}),
             trigger({"metric": "ttft", "threshold_ms": 5, "percentile": 90})]
    assert lowest_step_threshold(rules) == 250.5
    assert lowest_step_threshold(rules[2:]) is None


def alarms(conn) -> list:
    return [m for m in conn.ws.sent if isinstance(m, StepAlarm)]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_registry_sends_the_alarm_on_connect_and_on_change_only_to_probes_that_asked():
    registry = ProbeRegistry()
    asks = registry.add(identity("worker", 0), FakeWebSocket(), step_alarm=True)
    older = registry.add(identity("worker", 1), FakeWebSocket())  # an older probe: no step_alarm in its hello
    await settle()
    assert alarms(asks) == [], "no rule, nothing to say: a probe starts each connection without an alarm"
    registry.set_step_alarm(300.0)
    await settle()
    assert alarms(asks) == [StepAlarm(threshold_ms=300.0)] and registry.step_alarm_ms == 300.0
    registry.set_step_alarm(300.0)  # unchanged: not sent again
    await settle()
    assert len(alarms(asks)) == 1
    # Rules coming and going faster than the frames: the last value is the last sent, whatever came between.
    registry.set_step_alarm(100.0)
    registry.set_step_alarm(None)
    registry.set_step_alarm(120.0)
    await settle()
    assert alarms(asks)[-1] == StepAlarm(threshold_ms=120.0) and len(alarms(asks)) <= 4
    # A probe connecting now is sent the current value after its handshake.
    late = registry.add(identity("engine_core"), FakeWebSocket(), step_alarm=True)
    await settle()
    assert alarms(late) == [StepAlarm(threshold_ms=120.0)]
    registry.set_step_alarm(None)
    await settle()
    assert alarms(asks)[-1] == alarms(late)[-1] == StepAlarm(threshold_ms=None)
    assert older.ws.sent == [], "a probe that does not know the frame never gets it"


async def test_a_probe_that_cannot_be_reached_does_not_hold_up_the_others():
    registry = ProbeRegistry()
    gone = registry.add(identity("worker", 0), FakeWebSocket(), step_alarm=True)
    slow = registry.add(identity("worker", 1), FakeWebSocket(), step_alarm=True)
    here = registry.add(identity("worker", 2), FakeWebSocket(), step_alarm=True)
    gone.ws.reachable = False
    slow.ws.send_delay_s = 0.3
    registry.set_step_alarm(40.0)
    await asyncio.sleep(0.05)
    assert alarms(here) == [StepAlarm(threshold_ms=40.0)] and alarms(slow) == []
    await asyncio.sleep(0.4)
    assert alarms(slow) == [StepAlarm(threshold_ms=40.0)]


async def test_trigger_rules_set_the_alarm(aiohttp_client, tmp_path):
    start_rule = parse_rule({"metric": "step_duration", "threshold_ms": 900}, 50)
    app = make_app(ServiceSettings(trace_dir=tmp_path / "traces", probe_token=TOKEN, http_token=None, max_steps=50,
                                   max_capture_bytes=1 << 30, keep=5, triggers=[start_rule]))
    registry = app[REGISTRY]
    assert registry.step_alarm_ms == 900.0, "a rule of --triggers sets it at start"
    client = await aiohttp_client(app)

    async def add(body: dict) -> str:
        resp = await client.post("/triggers", json=body)
        assert resp.status == 201, await resp.text()
        return (await resp.json())["id"]

    low = await add({"metric": "step_duration", "threshold_ms": 400})
    assert registry.step_alarm_ms == 400.0
    await add({"metric": "step_duration", "threshold_ms": 50, "percentile": 95})
    assert registry.step_alarm_ms == 400.0, "a percentile rule is not the alarm's"
    assert (await client.delete(f"/triggers/{low}")).status == 200
    assert registry.step_alarm_ms == 900.0
    for listed in (await (await client.get("/triggers")).json())["triggers"]:
        assert (await client.delete(f"/triggers/{listed['id']}")).status == 200
    assert registry.step_alarm_ms is None


async def handshake(client, step_alarm: bool):
    ws = await client.ws_connect(PROBE_WS_PATH)
    nonce = auth.new_nonce()
    await ws.send_str(encode(Hello(protocol=PROTOCOL_VERSION, process=identity("worker", 0), nonce=nonce,
                                   step_alarm=step_alarm)))
    challenge = decode_from_sidecar((await ws.receive(timeout=5)).data)
    assert isinstance(challenge, Challenge)
    await ws.send_str(encode(Proof(proof=auth.probe_proof(TOKEN, challenge.nonce, nonce))))
    return ws


async def frames_within(ws, seconds: float) -> list:
    got, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            frame = await ws.receive(timeout=left)
        except asyncio.TimeoutError:
            break
        msg = decode_from_sidecar(frame.data)
        if not isinstance(msg, ClockProbe):
            got.append(msg)
    return got


async def test_the_probe_channel_sends_the_alarm_after_the_handshake(aiohttp_client, tmp_path):
    client = await aiohttp_client(make_app(ServiceSettings(
        trace_dir=tmp_path / "traces", probe_token=TOKEN, http_token=None, max_steps=50, max_capture_bytes=1 << 30,
        keep=5)))
    assert (await client.post("/triggers", json={"metric": "step_duration", "threshold_ms": 250})).status == 201
    asks = await handshake(client, step_alarm=True)
    assert await frames_within(asks, 1.0) == [StepAlarm(threshold_ms=250.0)]
    older = await handshake(client, step_alarm=False)
    assert await frames_within(older, 0.5) == []
    body = await (await client.get("/triggers")).json()
    assert (await client.delete(f"/triggers/{body['triggers'][0]['id']}")).status == 200
    assert await frames_within(asks, 1.0) == [StepAlarm(threshold_ms=None)]
    assert await frames_within(older, 0.3) == []
    await asks.close()
    await older.close()


# -- end to end ----------------------------------------------------------------------------------------
class SteppingEngine:
    """A stand-in engine's step thread in this process: 5 ms steps, one of ``ms`` when asked; keeps
    each slow step's end (``time.time_ns()``, as the probe's ring recorded it)."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.slow_ends: list[tuple[int, int]] = []  # (step number, end ns)
        self._slow: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def slow(self, ms: float) -> None:
        self._slow.append(ms)

    def _run(self) -> None:
        while not self._stop.is_set():
            ms = self._slow.pop(0) if self._slow else None
            self.probe.step_begin(True)
            time.sleep((ms if ms is not None else 5.0) / 1000)
            end = time.time_ns()
            if ms is not None:
                self.slow_ends.append((self.probe.steps + 1, end))
            self.probe.step_end(True, now_ns=end)

    def __enter__(self) -> "SteppingEngine":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


async def fired(client, trigger_id: str, count: int, timeout: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = await (await client.get(f"/triggers/{trigger_id}")).json()
        got = [f for f in reversed(body["firings"]) if f["outcome"] == "fired"]
        if len(got) >= count:
            return got
        await asyncio.sleep(0.02)
    raise AssertionError(body)


async def test_a_rule_fires_within_a_second_of_the_slow_steps_end_with_heartbeats_a_minute_apart(
        tmp_path, monkeypatch):
    """The regular heartbeat every 60 s here: a firing within a second of the step's end can only have
    come from the probe's early report."""
    monkeypatch.setattr(link, "HEARTBEAT_S", 60.0)
    monkeypatch.setenv("SIDECAR_TOKEN", TOKEN)
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(tmp_path / "probe-root"))
    app = make_app(ServiceSettings(trace_dir=tmp_path / "traces", probe_token=TOKEN, http_token=None, max_steps=50,
                                   max_capture_bytes=1 << 30, keep=5))
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    import aiohttp

    probe = Probe("worker", 0, endpoint=url, cuda_available=False).start()
    try:
        async with aiohttp.ClientSession(url) as client:
            resp = await client.post("/triggers", json={"metric": "step_duration", "threshold_ms": 300,
                                                        "cooldown_s": 1, "budget_per_hour": 100,
                                                        "action": {"capture_steps": 0, "recorder_seconds": 5}})
            assert resp.status == 201, await resp.text()
            rule = await resp.json()
            assert await asyncio.to_thread(probe.connected.wait, 60)  # the link imports torch.profiler first
            for _ in range(200):  # the alarm reaches the probe just after its handshake
                if probe._heartbeats.alarm_ms == 300.0:
                    break
                await asyncio.sleep(0.02)
            assert probe._heartbeats.alarm_ms == 300.0
            with SteppingEngine(probe) as engine:
                await asyncio.sleep(0.5)
                engine.slow(450)
                (first,) = await fired(client, rule["id"], 1, timeout=5)
                await asyncio.sleep(1.2)  # past the cooldown
                engine.slow(600)
                firings = await fired(client, rule["id"], 2, timeout=5)
            for firing, (step, end_ns) in zip(firings, engine.slow_ends):
                assert firing["step"] == step and firing["step_was"] == "ended", (firing, engine.slow_ends)
                late_s = firing["at"] - end_ns / 1e9
                # The probe looks every 0.1 s; a loaded host adds its scheduling. The next heartbeat was 60 s away.
                assert 0 <= late_s < 1.0, (late_s, firing)
                assert firing["observed_ms"] > 300, firing
    finally:
        await asyncio.to_thread(probe.close)
        await runner.cleanup()


async def test_stand_in_engines_fire_within_a_second_of_each_slow_steps_end(sidecar, engines):
    """A stand-in engine process (tests/fake_engine.py) with the regular 2 s heartbeat: a slow step every
    ~1.7 s, each firing (cooldown 1 s) within a second of its step's end by the flight recorder, where
    the next regular heartbeat alone would come 0-2 s after it."""
    client = await sidecar()
    resp = await client.post("/triggers", json={"metric": "step_duration", "threshold_ms": 300, "cooldown_s": 1,
                                                "budget_per_hour": 100,
                                                "action": {"capture_steps": 0, "recorder_seconds": 5}})
    assert resp.status == 201, await resp.text()
    rule = await resp.json()
    engines(client.url, "worker", "--rank", "0", "--step-ms", "20", "--slow-step-at", "50", "--slow-step-ms", "450")
    await wait_processes(client, 1)
    firings = await fired(client, rule["id"], 4, timeout=30)
    for _ in range(100):  # a firing's own recorder dump holds the probe's query slot a moment
        resp = await client.get("/recorder", params={"seconds": "60"})
        if resp.status == 200:
            break
        await asyncio.sleep(0.1)
    recorder = await resp.json()
    (proc,) = recorder["processes"]
    ends = {s["step"]: s["end_ns"] for s in proc["steps"] if s["duration_ms"] > 300}
    late = []
    for firing in firings[:4]:
        if firing["step_was"] == "running":  # a regular heartbeat came while it ran: earlier still
            continue
        late.append(firing["at"] - ends[firing["step"]] / 1e9)
    assert late and all(0 <= s < 1.0 for s in late), (late, firings)
