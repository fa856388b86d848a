"""The step rate behind the common start step (issue #10, defect 5): only differences between step
counts this sidecar received are rates; the first count on a connection is a baseline, however large.

A probe's heartbeat carries its working steps since the engine started, so right after a sidecar
restart the first one holds days of steps: divided by the two seconds since the connection it gave
~500,000 steps/s, and a capture armed a quarter second "ahead" at that rate waited 125,000 steps."""

import time

import pytest

from sidecar.common.protocol import Begin
from sidecar.service.jobs import arming
from sidecar.service.jobs.params import CaptureRequest, ScanRequest

from service_fakes import World, sent, until

REAL_RATE = 250.0  # working steps per second of the engine in these tests
# The lead at the real rate, with room for a slow test machine; the bug's lead was 125,000 steps.
CLOSE = arming.lead_steps(4 * REAL_RATE)


@pytest.fixture
async def world(tmp_path):
    w = World(tmp_path)
    yield w
    await w.close()


def connected_ago(world, seconds, role="worker", rank=0):
    """A probe that connected ``seconds`` ago (a sidecar restarted under a running engine)."""
    conn = world.connect(role, rank)
    conn.connected_at = conn.last_seen = time.time() - seconds
    return conn


def test_the_first_heartbeat_on_a_connection_is_a_baseline_not_a_rate(world):
    conn = world.connect("worker", 0)
    t0 = conn.connected_at
    conn.observe_steps(1_000_000, t0 + 2.0)
    assert conn.step_rate is None, "steps since the engine started are no rate"
    assert conn.to_json()["step_rate"] is None and conn.to_json()["last_step"] == 1_000_000
    conn.observe_steps(1_000_500, t0 + 4.0)
    assert conn.step_rate == pytest.approx(REAL_RATE)
    conn.observe_steps(1_000_510, t0 + 4.1)  # too close to the last count to be a rate of its own
    assert conn.step_rate == pytest.approx(REAL_RATE) and conn.steps == 1_000_510
    conn.observe_steps(1_001_000, t0 + 6.0)  # measured from the count at 4.0 s
    assert conn.step_rate == pytest.approx(REAL_RATE)


def test_a_reconnect_starts_again_from_a_baseline(world):
    first = world.connect("worker", 0)
    first.observe_steps(10, first.connected_at + 2.0)
    first.observe_steps(510, first.connected_at + 4.0)
    assert first.step_rate == pytest.approx(REAL_RATE)
    world.registry.remove(first)
    again = world.connect("worker", 0)
    again.observe_steps(5_000_000, again.connected_at + 2.0)
    assert again.step_rate is None


async def test_a_capture_armed_between_the_first_two_heartbeats_starts_close_to_the_count(world):
    conn = connected_ago(world, 3.0)
    conn.observe_steps(1_000_000, time.time() - 1.0)  # the first heartbeat after the restart
    capture = await world.captures.start(CaptureRequest(steps=3))
    seen = 1_000_000 + int(REAL_RATE)  # one second later, at the real rate
    await world.capture_report(conn, capture.id, "armed", steps_seen=seen)
    await until(lambda: sent(conn, Begin))
    assert seen < capture.start_step <= seen + CLOSE, capture.start_step - seen


async def test_a_scan_armed_before_any_heartbeat_gets_a_small_lead(world):
    conn = connected_ago(world, 0.5)
    scan = await world.scans.start(ScanRequest(steps=2))
    await world.sync_report(conn, scan.id, "armed", steps_seen=1_000_000)
    await until(lambda: sent(conn, Begin))
    assert scan.start_step == 1_000_000 + arming.lead_steps(None)
    assert arming.lead_steps(None) <= CLOSE


async def test_a_capture_after_two_heartbeats_uses_their_rate(world):
    conn = connected_ago(world, 5.0)
    conn.observe_steps(1_000_000, time.time() - 3.0)
    conn.observe_steps(1_000_500, time.time() - 1.0)
    capture = await world.captures.start(CaptureRequest(steps=3))
    await world.capture_report(conn, capture.id, "armed", steps_seen=1_000_750)
    await until(lambda: sent(conn, Begin))
    assert 1_000_750 + arming.lead_steps(REAL_RATE / 2) <= capture.start_step <= 1_000_750 + CLOSE
