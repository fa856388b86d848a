"""A probe's heartbeat (sidecar/probe/heartbeat.py): what it says, and what it says again after the
link dropped."""

import time
from types import SimpleNamespace

from sidecar.probe.flight_ring import StepRing
from sidecar.probe.heartbeat import HeartbeatSource
from sidecar.common.protocol import Heartbeat, InFlight


class Watch:
    """The always-on sync watch's face to the heartbeat: a version and a report."""

    def __init__(self):
        self.version = 1

    def report(self):
        return {"state": "watching", "version": self.version, "sites": []}


def test_the_watch_report_goes_once_per_version_and_again_after_a_reset():
    watch = Watch()
    source = HeartbeatSource(lambda: 3, watch=watch)
    assert source.build().sync_watch == {"state": "watching", "version": 1, "sites": []}
    assert source.build().sync_watch is None, "unchanged: not sent again"
    watch.version = 2
    assert source.build().sync_watch["version"] == 2
    source.reset()
    assert source.build().sync_watch["version"] == 2, "a new sidecar is told again"


def test_a_watch_that_could_not_run_says_why_once_per_connection():
    source = HeartbeatSource(lambda: 0, watch_note="SIDECAR_SYNC_WATCH needs CUDA")
    first = source.build().sync_watch
    assert first == {"state": "unavailable", "reason": "SIDECAR_SYNC_WATCH needs CUDA", "sites": []}
    assert source.build().sync_watch is None
    source.reset()
    assert source.build().sync_watch == first


def test_the_slowest_step_is_counted_from_the_first_heartbeat_of_a_connection():
    ring = StepRing(16)
    source = HeartbeatSource(lambda: 2, ring=ring)
    ring.begin(1_000_000_000)
    ring.end(0, True, now_ns=1_900_000_000)  # before the first heartbeat: history, not news
    assert source.build().slowest_step is None
    ring.begin(2_000_000_000)
    ring.end(1, True, now_ns=2_050_000_000)
    ring.begin(3_000_000_000)
    ring.end(2, True, now_ns=3_020_000_000)
    beat = source.build()
    assert (beat.slowest_step, beat.slowest_step_ms) == (1, 50.0)
    assert source.build().slowest_step is None, "each step is news once"
    source.reset()
    ring.begin(4_000_000_000)
    ring.end(3, True, now_ns=4_500_000_000)
    assert source.build().slowest_step is None, "after a reconnect, the steps before it are history"


def test_the_open_step_its_age_and_the_watchdog():
    ring = StepRing(4)
    ring.begin(time.time_ns() - 2_000_000_000)
    watchdog = SimpleNamespace(check=lambda: {"step": 5, "age_s": 2.0})
    beat = HeartbeatSource(lambda: 4, ring=ring, watchdog=watchdog).build()
    assert beat.steps == 4 and beat.stuck == {"step": 5, "age_s": 2.0}
    assert 1900 <= beat.open_step_ms <= 60_000


def test_requests_in_flight_are_summed_up_and_a_failing_reader_is_left_out():
    requests = [{"id": "a", "arrived_ns": 20}, {"id": "b", "arrived_ns": 10}, {"id": "c"}]
    beat = HeartbeatSource(lambda: 0, in_flight=lambda: requests).build()
    assert beat.in_flight == InFlight(count=3, oldest_arrival_ns=10)

    def broken():
        raise RuntimeError("engine state moved")

    assert HeartbeatSource(lambda: 0, in_flight=broken).build() == Heartbeat(steps=0)
