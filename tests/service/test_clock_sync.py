"""The clock estimate (sidecar/service/channel/clock_sync.py): NTP's offset and bound, the fastest round trip
chosen, an offset applied only where it exceeds its bound."""

import asyncio

from sidecar.common.protocol import ClockReply
from sidecar.service.channel.clock_sync import MAX_PENDING, ClockEstimate, keep_probing

MS = 1_000_000


def exchange(est: ClockEstimate, sent: int, probe_ns: int, arrived: int):
    msg = est.probe(now_ns=sent)
    return est.on_reply(ClockReply(seq=msg.seq, probe_ns=probe_ns), now_ns=arrived)


def test_offset_and_uncertainty_of_one_round_trip():
    est = ClockEstimate()
    # The probe's clock is 5 s ahead; 2 ms out, 6 ms back: the midpoint guess is 2 ms off the truth,
    # within the bound of half the 8 ms round trip.
    sample = exchange(est, sent=1000 * MS, probe_ns=5000 * MS + 1002 * MS, arrived=1008 * MS)
    assert sample.offset_ns == 5000 * MS - 2 * MS and sample.uncertainty_ns == 4 * MS
    assert abs(sample.offset_ns - 5000 * MS) <= sample.uncertainty_ns
    assert est.significant and est.correction_ns == sample.offset_ns
    assert est.to_json() == {"offset_ms": 4998.0, "uncertainty_ms": 4.0, "applied": True, "samples": 1}


def test_the_fastest_round_trip_wins():
    est = ClockEstimate()
    exchange(est, 0, 3 * MS + 40 * MS, 100 * MS)  # a slow one: 50 ms bound
    best = exchange(est, 200 * MS, 3 * MS + 201 * MS, 202 * MS)  # 1 ms bound
    exchange(est, 300 * MS, 3 * MS + 310 * MS, 330 * MS)
    assert est.best == best and best.offset_ns == 3 * MS - 0


def test_one_host_is_never_corrected():
    est = ClockEstimate()
    for start in range(0, 100 * MS, 10 * MS):  # the same clock: the reading lies inside the round trip
        exchange(est, start, start + 3 * MS, start + 4 * MS)
    assert abs(est.best.offset_ns) <= est.best.uncertainty_ns
    assert not est.significant and est.correction_ns == 0 and est.to_json()["applied"] is False


def test_replies_not_sent_here_are_ignored_and_pending_is_bounded():
    est = ClockEstimate()
    assert est.on_reply(ClockReply(seq=99, probe_ns=1)) is None
    assert est.best is None and est.to_json() is None and est.correction_ns == 0
    first = est.probe(now_ns=0)
    for _ in range(MAX_PENDING):
        est.probe(now_ns=0)
    assert est.on_reply(ClockReply(seq=first.seq, probe_ns=1), now_ns=1) is None  # dropped, oldest first
    assert len(est._pending) == MAX_PENDING


async def test_probing_stops_when_the_connection_does():
    est, sent = ClockEstimate(), []

    async def send(msg):
        sent.append(msg.seq)
        return len(sent) < 4

    await asyncio.wait_for(keep_probing(est, send, first=10, first_gap_s=0.0), 5)
    assert sent == [1, 2, 3, 4]
