"""A process whose link dropped just before a job starts: the start waits for it to reconnect (a link
the sidecar dropped on a starved host is back within the probe's 2 s backoff), and one that does not
come back is named in the job's notes, not left out without a word (a capture otherwise ends "done"
with fewer processes than the user has)."""

import asyncio
import time

import pytest

from sidecar.service.channel import registry as registry_module
from sidecar.service.jobs.params import CaptureRequest, ProcessSelector, ScanRequest

from service_fakes import FakeWebSocket, World


@pytest.fixture
async def world(tmp_path):
    w = World(tmp_path)
    yield w
    await w.close()


async def test_a_start_waits_for_a_link_that_just_dropped_and_takes_the_process_back(world):
    core, w0 = world.connect("engine_core"), world.connect("worker", 0)
    world.registry.remove(w0)

    async def reconnect():
        await asyncio.sleep(0.3)
        return world.registry.add(w0.identity, FakeWebSocket())

    back = asyncio.ensure_future(reconnect())
    capture = await world.captures.start(CaptureRequest(steps=2))
    assert {p.conn for p in capture.processes} == {core, await back}
    assert capture.notes == []
    await world.captures.stop()


async def test_a_process_that_does_not_come_back_is_named_in_the_capture(world, monkeypatch):
    monkeypatch.setattr(registry_module, "RETURN_WAIT_S", 0.2)
    core, w0 = world.connect("engine_core"), world.connect("worker", 0)
    world.registry.remove(w0)
    capture = await world.captures.start(CaptureRequest(steps=2))
    assert [p.conn for p in capture.processes] == [core]
    [note] = capture.notes
    assert w0.identity.label in note and "lost its link to the sidecar" in note and "capture" in note, note
    await world.captures.stop()


async def test_only_a_process_the_job_would_have_taken_is_named(world, monkeypatch):
    monkeypatch.setattr(registry_module, "RETURN_WAIT_S", 0.0)
    world.connect("engine_core")
    w0, w1, api = world.connect("worker", 0), world.connect("worker", 1), world.connect("api_server")
    for conn in (w1, api):
        world.registry.remove(conn)
    # A scan takes no API server; a selection of worker 0 does not take worker 1.
    scan = await world.scans.start(ScanRequest(steps=2, processes=(ProcessSelector("worker", 0),)))
    assert [p.conn for p in scan.processes] == [w0] and scan.notes == []
    await world.scans.stop()


async def test_a_reconnected_process_is_not_lost_and_the_memory_of_losses_is_bounded(world, monkeypatch):
    w0 = world.connect("worker", 0)
    world.registry.remove(w0)
    assert [lost.identity for lost in world.registry.recently_lost()] == [w0.identity]
    world.registry.add(w0.identity, FakeWebSocket())
    assert world.registry.recently_lost() == []

    monkeypatch.setattr(registry_module, "MAX_RECENTLY_LOST", 3)
    gone = [world.connect("worker", rank) for rank in range(5)]
    for conn in gone:
        world.registry.remove(conn)
    assert [lost.identity for lost in world.registry.recently_lost()] == [c.identity for c in gone[-3:]]

    later = time.monotonic() + registry_module.RECENTLY_LOST_S + 1
    assert world.registry.recently_lost(now=later) == []
    assert world.registry.recently_lost() == [], "forgotten, not only hidden"
