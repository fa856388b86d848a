"""Packed recorder dumps (sidecar/common/packed_rows.py, ``Query.packed``): the probe sends each ring's
rows as the ring holds them, and the sidecar makes the columns. Whatever the probe sends packed, the
sidecar must end up with exactly the JSON dump of the same query (same rows, same cut), and anything
else a probe could write is a clear error, not a crash."""

from __future__ import annotations

import json
import sys
import threading
import time
from array import array

import msgspec
import pytest

from sidecar.common import packed_rows
from sidecar.common.protocol import Query
from sidecar.probe.flight_ring import GcPauses, RequestRing, StepRing
from sidecar.probe.queries import QueryAnswerer
from sidecar.service.incidents.recorder_dump import decode_dump

T0 = 1_800_000_000_000_000_000


def _through_the_wire(dump: dict) -> dict:
    """What the sidecar decodes from the probe's file."""
    return msgspec.msgpack.decode(msgspec.msgpack.encode(dump))


def _steps(ring_capacity: int, ends: list[int]) -> StepRing:
    ring = StepRing(capacity=ring_capacity)
    for i, end in enumerate(ends):
        ring.begin(end - 400)
        ring.end(i, i % 3 != 0, batch=i, tokens=2 * i, prefill_tokens=i % 5, decode_tokens=i % 7, running=1,
                 waiting=0, now_ns=end)
    return ring


def _unpacked_steps(ring: StepRing, since_ns: int, tail: bool) -> dict:
    packed = _through_the_wire(ring.dump(since_ns, tail=tail, packed=True))
    return packed_rows.unpack(packed["steps"], "end_ns")


@pytest.mark.parametrize("tail", [False, True])
@pytest.mark.parametrize("since_offset", [None, 0, 120, 249, 250, 400])
def test_a_packed_step_ring_is_cut_to_the_json_dumps_rows(tail, since_offset):
    # 250 rows in a ring of 100: it has wrapped, and holds rows 150..249.
    ring = _steps(100, [T0 + i * 1000 for i in range(250)])
    since = 0 if since_offset is None else T0 + since_offset * 1000
    expected = ring.dump(since, tail=tail)["steps"]
    assert _unpacked_steps(ring, since, tail) == expected
    assert len(expected["end_ns"]) == {None: 100, 0: 100, 120: 100, 249: 1, 250: 0, 400: 0}[since_offset]


@pytest.mark.parametrize("tail", [False, True])
def test_a_clock_stepped_back_is_cut_as_the_json_dump_cuts_it(tail):
    # The wall clock stepped back 60 µs after row 40: every key is tested, not bisected. A tail read
    # copies the newest rows the ring says reach ``since`` and 256 more: here every row, so the sidecar
    # finds the rows of the older clock too, which the probe's JSON tail read leaves to the next
    # read's overlap (flight_ring.py, _tail_columns).
    ends = [T0 + i * 1000 for i in range(40)] + [T0 - 60_000 + i * 1000 for i in range(40, 90)]
    ring = _steps(128, ends)
    for since in (T0 + 5_000, T0 + 35_000, T0 - 10_000):
        assert _unpacked_steps(ring, since, tail) == ring.dump(since)["steps"], since


def test_the_gc_and_request_rings_and_the_whole_dump():
    pauses = GcPauses(capacity=8, min_pause_ns=0)
    pauses.install()
    try:
        for _ in range(12):
            __import__("gc").collect()
    finally:
        pauses.uninstall()
    requests = RequestRing(capacity=10)
    for i in range(15):
        requests.add(f"req-{i}", T0 + i, T0 + i + 1 if i % 4 else -1, T0 + 10 + i,
                     ("finished", "aborted", "error", "strange")[i % 4], 3 * i, i)
    ring = _steps(64, [T0 + i * 1000 for i in range(80)])
    for since in (0, T0 + 17, pauses.dump()["start_ns"][-3]):
        json_dump = {"gc": pauses.dump(since), "steps": ring.dump(since), "requests": requests.dump(since)}
        packed = {"packed": packed_rows.PACKED_FORMAT, "gc": pauses.dump(since, packed=True),
                  "steps": ring.dump(since, packed=True), "requests": requests.dump(since, packed=True)}
        assert packed_rows.unpack_dump(_through_the_wire(packed)) == json.loads(json.dumps(json_dump))
    assert "strange" not in requests.dump()["outcome"] and "unknown" in requests.dump()["outcome"]


def test_rows_of_the_other_byte_order_are_swapped():
    ring = _steps(16, [T0 + i * 1000 for i in range(10)])
    packed = _through_the_wire(ring.dump(0, packed=True))["steps"]
    values = array("q", packed["rows"])
    values.byteswap()
    other = "big" if sys.byteorder == "little" else "little"
    swapped = {**packed, "rows": values.tobytes(), "byteorder": other}
    assert packed_rows.unpack(swapped, "end_ns") == ring.dump(0)["steps"]


def _packed_ring() -> dict:
    return {"fields": ["step", "start_ns", "end_ns"], "byteorder": sys.byteorder,
            "rows": array("q", [1, 2, 3, 4, 5, 6]).tobytes(), "since_ns": 0}


@pytest.mark.parametrize("change, problem", [
    ({"fields": "step"}, "distinct names"),
    ({"fields": ["step", "step", "end_ns"]}, "distinct names"),
    ({"fields": []}, "distinct names"),
    ({"rows": [1, 2, 3]}, "whole rows"),
    ({"rows": b"\x00" * 20}, "whole rows"),
    ({"since_ns": -1}, "since_ns"),
    ({"since_ns": True}, "since_ns"),
    ({"byteorder": "middle"}, "byteorder"),
    ({"fields": ["step", "start_ns", "other"]}, "no end_ns column"),
])
def test_a_malformed_packed_ring_is_a_value_error_naming_the_problem(change, problem):
    with pytest.raises(ValueError, match=problem):
        packed_rows.unpack({**_packed_ring(), **change}, "end_ns")


@pytest.mark.parametrize("dump, problem", [
    ([], "not a packed recorder dump"),
    ({"packed": 99}, "not a packed recorder dump"),
    ({"packed": 1, "steps": []}, "steps are not a map"),
    ({"packed": 1, "gc": {"packed": "x"}}, "not a map"),
    ({"packed": 1, "requests": {"packed": {**_packed_ring(), "fields": ["finished_ns"], "rows": b"\x01" * 16,
                                            "ids": ["a"]}}}, "one string per row"),
])
def test_a_malformed_packed_dump_is_a_value_error(dump, problem):
    with pytest.raises(ValueError, match=problem):
        packed_rows.unpack_dump(dump)
    with pytest.raises(ValueError):
        decode_dump(msgspec.msgpack.encode(dump), "worker-pid1-q3.msgpack")
    with pytest.raises(ValueError, match="not msgpack"):
        decode_dump(b"\xc1", "worker-pid1-q3.msgpack")


def test_a_packed_query_is_written_as_msgpack_and_read_back_as_the_json_dump(tmp_path):
    ring = _steps(32, [time.time_ns() - (40 - i) * 1_000_000 for i in range(40)])
    folder = tmp_path / "recorder"
    folder.mkdir()
    (folder / "worker-pid1-q3.msgpack").write_bytes(b"old")  # an earlier packed dump, never read: removed

    def recorder_dump(seconds, since_ns=0, packed=False):
        since = max(since_ns, time.time_ns() - int(seconds * 1e9)) if seconds else since_ns
        dump = {"steps": ring.dump(since, tail=since_ns > 0, packed=packed)}
        return {**dump, "packed": packed_rows.PACKED_FORMAT} if packed else dump

    sent, done = [], threading.Event()
    answerer = QueryAnswerer(send=lambda a: (sent.append(a), done.set()), recorder_dump=recorder_dump,
                             recorder_file=lambda q, packed=False: str(folder / f"worker-pid1-q{q}.{'msgpack' if packed else 'json'}"),
                             step_thread_id=lambda: None, in_flight=None)
    since = ring.dump()["steps"]["end_ns"][20]
    answerer.answer(Query(query_id=5, kind="recorder", seconds=600, since_ns=since, packed=True))
    assert done.wait(10) and sent[0].error is None, sent
    assert sent[0].file == str(folder / "worker-pid1-q5.msgpack")
    assert [p.name for p in folder.iterdir()] == ["worker-pid1-q5.msgpack"]
    got = decode_dump((folder / "worker-pid1-q5.msgpack").read_bytes(), "worker-pid1-q5.msgpack")
    assert got["steps"] == json.loads(json.dumps(ring.dump(since, tail=True)))
    assert len(got["steps"]["steps"]["end_ns"]) == 12
