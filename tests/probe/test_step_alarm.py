"""The step alarm on the probe's side (issue 30): the sidecar's ``step_alarm`` frame, the heartbeat
source's ``early`` (sidecar/probe/heartbeat.py), and a real probe's link sending a heartbeat as soon as
a step over the threshold ends, never otherwise, at most one every ``EARLY_MIN_INTERVAL_S``."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import msgspec
import pytest
from aiohttp import web

from sidecar.common import auth
from sidecar.common.protocol import PROBE_WS_PATH, Challenge, Heartbeat, Hello, Proof, StepAlarm
from sidecar.common.protocol_codec import (ProtocolError, decode_from_probe, decode_from_sidecar, decode_hello,
                                           encode)
from sidecar.engine import GENERIC
from sidecar.probe import Probe, link
from sidecar.probe.flight_ring import StepRing
from sidecar.probe.heartbeat import EARLY_MIN_INTERVAL_S, HeartbeatSource

TOKEN = "step-alarm-token"
MS = 1_000_000  # ns


# -- the frames ----------------------------------------------------------------------------------------
def test_the_step_alarm_frame_round_trips_and_a_bad_threshold_is_refused():
    for msg in (StepAlarm(threshold_ms=250.0), StepAlarm(threshold_ms=None), StepAlarm()):
        assert decode_from_sidecar(encode(msg)) == msg
    assert json.loads(encode(StepAlarm(threshold_ms=0.5))) == {"type": "step_alarm", "threshold_ms": 0.5}
    for bad in (0, -1, "300", True):
        with pytest.raises(ProtocolError):
            decode_from_sidecar(json.dumps({"type": "step_alarm", "threshold_ms": bad}))


def test_the_hello_says_step_alarm_and_a_field_a_peer_does_not_know_is_skipped():
    process = GENERIC.identity("worker", 0, pid=7, host="test")
    hello = Hello(protocol=10, process=process, nonce="0" * 64, step_alarm=True)
    assert decode_hello(encode(hello)) == hello
    assert decode_hello(encode(msgspec.structs.replace(hello, step_alarm=False))).step_alarm is False
    # An older probe's hello has no step_alarm: False, so it is never sent the frame it does not know.
    older = json.loads(encode(hello))
    del older["step_alarm"]
    assert decode_hello(json.dumps(older)).step_alarm is False
    # A sidecar skips a hello field it does not know (as one without step_alarm skips that one).
    assert decode_hello(json.dumps({**older, "a_later_field": [1, 2]})) == msgspec.structs.replace(hello, step_alarm=False)


# -- HeartbeatSource.early -----------------------------------------------------------------------------
BASE_NS = 1_700_000_000 * 10**9  # a Unix time: a start of 0 would mean "now" to StepRing.begin


def step(ring: StepRing, number: int, start_ms: float, duration_ms: float) -> None:
    ring.begin(BASE_NS + int(start_ms * MS))
    ring.end(number, True, now_ns=BASE_NS + int((start_ms + duration_ms) * MS))


def test_no_alarm_no_early_heartbeat():
    ring = StepRing(64)
    source = HeartbeatSource(lambda: 0, ring=ring)
    step(ring, 1, 0, 900)
    assert source.early(0.0) is None, "no threshold: nothing to watch"
    source.set_step_alarm(100.0)
    source.set_step_alarm(None)
    step(ring, 2, 1000, 900)
    assert source.early(10.0) is None and source.alarm_ms is None
    # A process without a step ring (an API server) has nothing to report early.
    ringless = HeartbeatSource(lambda: 0)
    ringless.set_step_alarm(100.0)
    assert ringless.early(0.0) is None


def test_a_step_over_the_threshold_asks_for_a_heartbeat_once():
    ring = StepRing(64)
    source = HeartbeatSource(lambda: 3, ring=ring)
    step(ring, 1, 0, 900)  # before the alarm: history
    source.set_step_alarm(300.0)
    assert source.early(0.0) is False, "a step before the alarm is not news"
    step(ring, 2, 1000, 20)
    step(ring, 3, 1020, 300)  # exactly the threshold: not over it (the rule's own test is ``>``)
    assert source.early(1.0) is False
    step(ring, 4, 1320, 301)
    step(ring, 5, 1621, 10)
    assert source.early(2.0) is True
    assert source.early(3.0) is False, "reported: not again"
    # The heartbeat that goes then carries it: the slowest step since the last heartbeat.
    beat = source.build()
    assert (beat.slowest_step, beat.slowest_step_ms) == (4, 301.0)
    assert source.early(4.0) is False


def test_the_alarm_set_before_the_first_heartbeat_keeps_the_step_for_it():
    """A sidecar sends its alarm right after the handshake, 2 s before the connection's first regular
    heartbeat: a slow step in between is news for the early heartbeat, not history."""
    ring = StepRing(64)
    source = HeartbeatSource(lambda: 1, ring=ring)
    step(ring, 1, 0, 700)
    source.set_step_alarm(500.0)
    step(ring, 2, 800, 600)
    assert source.early(1.0) is True
    beat = source.build()
    assert (beat.slowest_step, beat.slowest_step_ms) == (2, 600.0)


def test_early_heartbeats_are_rate_limited_and_a_regular_one_covers_a_waiting_step():
    ring = StepRing(64)
    source = HeartbeatSource(lambda: 0, ring=ring)
    source.set_step_alarm(50.0)
    step(ring, 1, 0, 60)
    assert source.early(100.0) is True
    source.build()
    step(ring, 2, 60, 60)  # another slow step at once: it waits for the interval
    assert source.early(100.05) is False
    assert source.early(100.0 + EARLY_MIN_INTERVAL_S / 2) is False
    assert source.early(100.0 + EARLY_MIN_INTERVAL_S) is True
    beat = source.build()
    assert beat.slowest_step == 2
    # A regular heartbeat sent while a slow step waited for the interval reported it: no early one after.
    step(ring, 3, 120, 60)
    assert source.early(100.0 + 2 * EARLY_MIN_INTERVAL_S) is True
    source.build()
    step(ring, 4, 180, 60)
    assert source.early(100.05 + 2 * EARLY_MIN_INTERVAL_S) is False  # waiting for the interval
    assert source.build().slowest_step == 4  # the regular beat
    assert source.early(101.0) is False


def test_a_dropped_link_forgets_the_alarm():
    ring = StepRing(64)
    source = HeartbeatSource(lambda: 0, ring=ring)
    source.set_step_alarm(10.0)
    step(ring, 1, 0, 20)
    source.reset()
    assert source.alarm_ms is None and source.early(5.0) is None
    source.set_step_alarm(10.0)  # the next sidecar's: steps before it are history
    assert source.early(6.0) is False


def test_early_reads_only_new_rows_and_costs_little():
    """The link thread's side of the alarm, per poll (0.1 s): the rows since the last look. Measured,
    not a benchmark: a bound far above what it takes, to catch a whole-ring read creeping in."""
    ring = StepRing(65536)
    for i in range(65536):
        step(ring, i, i * 10, 5)
    source = HeartbeatSource(lambda: 0, ring=ring)
    source.set_step_alarm(100.0)
    started = time.perf_counter()
    for i in range(1000):
        for j in range(10):  # 10 steps per poll: 100 steps/s
            step(ring, 70000 + i * 10 + j, 1e6 + (i * 10 + j) * 10, 5)
        source.early(float(i))
    per_poll_us = (time.perf_counter() - started) / 1000 * 1e6
    assert per_poll_us < 500, per_poll_us


# -- a real probe's link against a stand-in sidecar ----------------------------------------------------
class AlarmSidecar:
    """A sidecar that does the handshake, sends ``alarm`` (a StepAlarm's threshold) unless None, and
    keeps each heartbeat with its arrival (``time.time_ns()``)."""

    def __init__(self, alarm: float | None) -> None:
        self.alarm = alarm
        self.hellos: list[Hello] = []
        self.beats: list[tuple[int, Heartbeat]] = []
        self.ws: web.WebSocketResponse | None = None

    async def handle(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        hello = decode_hello((await ws.receive(timeout=5)).data)
        self.hellos.append(hello)
        nonce = auth.new_nonce()
        await ws.send_str(encode(Challenge(nonce=nonce, proof=auth.sidecar_proof(TOKEN, hello.nonce, nonce))))
        proof = decode_from_probe((await ws.receive(timeout=5)).data)
        assert isinstance(proof, Proof) and auth.probe_proof_ok(TOKEN, nonce, hello.nonce, proof.proof)
        self.ws = ws
        if self.alarm is not None:
            await ws.send_str(encode(StepAlarm(threshold_ms=self.alarm)))
        async for frame in ws:
            msg = decode_from_probe(frame.data)
            if isinstance(msg, Heartbeat):
                self.beats.append((time.time_ns(), msg))
        return ws

    async def set_alarm(self, threshold_ms: float | None) -> None:
        await self.ws.send_str(encode(StepAlarm(threshold_ms=threshold_ms)))


class Steps:
    """An engine's step thread: 5 ms steps, and a step of ``ms`` whenever ``slow(ms)`` asks; keeps each
    slow step's end (``time.time_ns()``, the end the probe's ring recorded)."""

    def __init__(self, probe: Probe, fast_ms: float = 5.0) -> None:
        self.probe, self.fast_ms = probe, fast_ms
        self.slow_ends: list[int] = []
        self._slow: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def slow(self, ms: float, times: int = 1) -> None:
        self._slow.extend([ms] * times)

    def _run(self) -> None:
        while not self._stop.is_set():
            ms = self._slow.pop(0) if self._slow else None
            self.probe.step_begin(True)
            time.sleep((ms if ms is not None else self.fast_ms) / 1000)
            end = time.time_ns()
            if ms is not None:
                self.slow_ends.append(end)
            self.probe.step_end(True, now_ns=end)

    def __enter__(self) -> "Steps":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
async def alarm_sidecar(monkeypatch, tmp_path):
    """A stand-in sidecar and a started probe connected to it; the regular heartbeat every 60 s, so
    every heartbeat the test sees is an early one."""
    monkeypatch.setattr(link, "HEARTBEAT_S", 60.0)
    monkeypatch.setenv("SIDECAR_TOKEN", TOKEN)
    monkeypatch.setenv("SIDECAR_TRACE_DIR", str(tmp_path / "probe-root"))
    runners, probes = [], []

    async def start(alarm: float | None) -> tuple[AlarmSidecar, Probe]:
        stand_in = AlarmSidecar(alarm)
        app = web.Application()
        app.router.add_get(PROBE_WS_PATH, stand_in.handle)
        runner = web.AppRunner(app, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        probe = Probe("worker", 0, endpoint=f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}",
                      cuda_available=False)
        probes.append(probe.start())
        assert await asyncio.to_thread(probe.connected.wait, 60)  # the link imports torch.profiler first
        for _ in range(100):  # the alarm frame reaches the probe just after the handshake
            if probe._heartbeats.alarm_ms == alarm:
                break
            await asyncio.sleep(0.02)
        return stand_in, probe

    yield start
    for probe in probes:
        await asyncio.to_thread(probe.close)
    for runner in runners:
        await runner.cleanup()


async def wait_beats(stand_in: AlarmSidecar, count: int, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while len(stand_in.beats) < count and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def test_a_slow_step_is_reported_as_soon_as_it_ends_and_fast_ones_are_not(alarm_sidecar):
    stand_in, probe = await alarm_sidecar(200.0)
    assert stand_in.hellos[0].step_alarm is True, "a step-driven probe acts on the alarm"
    with Steps(probe) as steps:
        await asyncio.sleep(1.0)  # fast steps only: nothing to report
        assert stand_in.beats == []
        steps.slow(350)
        await wait_beats(stand_in, 1)
        assert len(stand_in.beats) == 1, "one early heartbeat for the slow step"
        arrived, beat = stand_in.beats[0]
        assert beat.slowest_step_ms >= 350 and beat.slowest_step_ms > 200
        # The poll (0.1 s) and a loaded host's scheduling: well under a second, with the 60 s beat.
        late_s = (arrived - steps.slow_ends[0]) / 1e9
        assert 0 <= late_s < 0.9, late_s
        await asyncio.sleep(0.5)
        assert len(stand_in.beats) == 1, "reported once"
        # The sidecar's rule is gone: a slow step waits for the regular beat again.
        await stand_in.set_alarm(None)
        for _ in range(100):
            if probe._heartbeats.alarm_ms is None:
                break
            await asyncio.sleep(0.02)
        steps.slow(350)
        await asyncio.sleep(1.0)
        assert len(steps.slow_ends) == 2 and len(stand_in.beats) == 1
        # And set again (a rule added): the next slow step is reported at once. (The step that ended
        # while there was none has not been reported either: it goes now, as the next beat would take it.)
        await stand_in.set_alarm(100.0)
        await asyncio.sleep(0.5)
        assert len(stand_in.beats) == 2 and stand_in.beats[1][1].slowest_step_ms >= 350
        steps.slow(150)
        await wait_beats(stand_in, 3)
        assert len(stand_in.beats) == 3 and 150 <= stand_in.beats[2][1].slowest_step_ms < 350
        assert (stand_in.beats[2][0] - steps.slow_ends[2]) / 1e9 < 0.9


async def test_no_alarm_no_early_heartbeat_from_a_real_probe(alarm_sidecar):
    stand_in, probe = await alarm_sidecar(None)
    with Steps(probe) as steps:
        steps.slow(400, times=2)
        await asyncio.sleep(1.5)
        assert len(steps.slow_ends) == 2
    assert stand_in.beats == []


async def test_a_slow_engine_sends_at_most_one_early_heartbeat_per_interval(alarm_sidecar):
    stand_in, probe = await alarm_sidecar(20.0)
    built: list[float] = []  # when the link thread built each heartbeat (every one here is early)
    build = probe._link._heartbeat

    def recorded():
        built.append(time.monotonic())
        return build()

    probe._link._heartbeat = recorded
    with Steps(probe, fast_ms=30.0):  # every step over the threshold
        await asyncio.sleep(2.0)
    await asyncio.sleep(0.3)
    gaps = [b - a for a, b in zip(built, built[1:])]
    # 2 s of 33 steps/s, every one slow: about 2 / 0.2 early heartbeats, never 66.
    assert 5 <= len(built) <= 2.0 / EARLY_MIN_INTERVAL_S + 2, built
    assert min(gaps) >= EARLY_MIN_INTERVAL_S * 0.99, gaps
    assert len(stand_in.beats) == len(built)
    assert all(beat.slowest_step_ms > 20 for _, beat in stand_in.beats)
