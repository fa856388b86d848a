"""An incremental recorder dump (``StepRing.dump(since_ns, tail=True)``, asked with ``Query.since_ns`` by
the home page's refreshes): the same rows as the whole ring's read, from a copy of the newest slots
only, consistent while the step thread writes, and the whole read again where the tail cannot tell."""

from __future__ import annotations

import threading

import pytest

from sidecar.probe.flight_ring import StepRing


def _ring(capacity: int, ends: list[int]) -> StepRing:
    ring = StepRing(capacity)
    for i, end in enumerate(ends):
        ring.begin(end - 3)
        ring.end(i, True, 1, 2, 3, 4, 5, 6, now_ns=end)
    return ring


@pytest.mark.parametrize("capacity", [1, 10, 100])
@pytest.mark.parametrize("extra", [0, 1, 7, 250])
def test_the_tail_is_the_rows_the_whole_read_gives(capacity, extra):
    written = capacity + extra - 1 if capacity + extra > 1 else 1
    ring = _ring(capacity, [1000 + 10 * i for i in range(written)])
    for since in (1, 1000, 1005, 1000 + 10 * (written // 2), 1000 + 10 * written - 10, 1000 + 10 * written + 50):
        assert ring.dump(since, tail=True) == ring.dump(since)


def test_a_clock_stepped_back_in_the_tail_falls_back_to_the_whole_read():
    ring = _ring(10, [10, 20, 30, 25, 40])
    assert ring.dump(22, tail=True)["steps"]["end_ns"] == ring.dump(22)["steps"]["end_ns"] == [30, 25, 40]


def test_a_tail_read_while_the_step_thread_writes_has_whole_rows_in_order():
    ring = StepRing(5000)
    stop = threading.Event()

    def steps():
        i, t = 0, 10_000
        while not stop.is_set():
            ring.begin(t)
            ring.end(i, True, i, i, i, i, i, i, now_ns=t + 7)
            i, t = i + 1, t + 10

    writer = threading.Thread(target=steps)
    writer.start()
    try:
        for _ in range(300):
            since = 10_000 + 10 * max(0, ring.written - 800)
            cols = ring.dump(since, tail=True)["steps"]
            assert all(e >= since for e in cols["end_ns"])
            assert all(e - s == 7 for s, e in zip(cols["start_ns"], cols["end_ns"]))  # no half-written row
            assert all(b == a + 1 for a, b in zip(cols["step"], cols["step"][1:]))  # none missing, none twice
            assert cols["batch"] == cols["step"]
    finally:
        stop.set()
        writer.join()


def test_a_query_with_since_ns_asks_the_probe_for_the_rows_since_then(tmp_path):
    import msgspec

    from sidecar.common.protocol import Query
    from sidecar.probe.queries import QueryAnswerer

    asked = []
    done = threading.Event()
    answerer = QueryAnswerer(send=lambda a: done.set(),
                             recorder_dump=lambda seconds, **kw: asked.append((seconds, kw)) or {"gc": {}},
                             recorder_file=lambda q: str(tmp_path / "recorder" / f"worker-pid1-q{q}.json"),
                             step_thread_id=lambda: None, in_flight=None)
    answerer.answer(Query(query_id=1, kind="recorder", seconds=5.0, since_ns=1_800_000_000_000_000_000))
    assert done.wait(10)
    assert asked == [(5.0, {"since_ns": 1_800_000_000_000_000_000})]
    # A probe that predates the field ignores it: an old Query decodes a new one's frame.
    class OldQuery(msgspec.Struct, tag="query", tag_field="type", kw_only=True, frozen=True):
        query_id: int
        kind: str
        seconds: float = 0.0
    frame = msgspec.json.encode(Query(query_id=2, kind="recorder", seconds=5.0, since_ns=7))
    assert msgspec.json.decode(frame, type=OldQuery).seconds == 5.0
