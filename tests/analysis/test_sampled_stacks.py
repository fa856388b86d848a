"""The raw samples file (sidecar/stacks/samples_file.py) and what the sidecar makes of it
(sidecar/stacks/sampled.py): a probe's dump reads back as it was sampled, in either byte
order; a corrupt file is refused naming the problem; slices, track and summary follow the samples."""

from __future__ import annotations

import sys
import threading
import time
from array import array

import msgspec
import pytest

from sidecar.stacks import sampled as sampled_stacks
from sidecar.stacks.sampled import CATEGORY, TRACK_NAME, TRACK_TID_BASE
from sidecar.stacks.sampler import StackSampler
from sidecar.stacks.samples_file import (
    FORMAT,
    RawSamples,
    SamplesFormatError,
    Segment,
    check,
    decode,
    encode,
    read,
    samples_path,
)

pytestmark = pytest.mark.timeout(60)
MS = 1_000_000
WALL = 1_790_000_000_000_000_000  # Unix ns at monotonic 0 in the synthetic samples
FILE = "/srv/app/sched.py"


def synthetic(**changes) -> RawSamples:
    """Four samples 1 ms apart from 1 ms after start(): outer > first, twice, then outer > second,
    twice; a 1 kHz sampler whose clock pairs say Unix = WALL + monotonic; no GIL waits (so each
    sample stands for half of each gap around it, the first also for the time since start()).
    Frame 0 is the cut marker, as a sampler's."""
    frames = [("[stack cut at 128 frames]", "", 0), ("outer", FILE, 10), ("first", FILE, 20), ("second", FILE, 30)]
    stacks = [(2, 1), (3, 1)]  # innermost first
    fields = dict(
        pid=4242, thread_id=140000, native_id=777, hz=1000.0, period_ns=MS, switch_interval_s=0.005,
        frames=frames, cut_frame=0,
        stack_frames=array("i", [f for s in stacks for f in s]).tobytes(), stack_ends=array("i", [2, 4]).tobytes(),
        times=array("q", [0, MS, 2 * MS, 3 * MS]).tobytes(), stack_ids=array("i", [0, 0, 1, 1]).tobytes(),
        lines=array("i", [21, 21, 33, 34]).tobytes(), waits=array("q", [0, 0, 0, 0]).tobytes(),
        segments=[Segment(0, 4, -MS, 4 * MS, (0, WALL), (10 * MS, WALL + 10 * MS))],
        cpu_ns=MS, active_ns=4 * MS, events=3, estimated_bytes=800,
    )
    fields.update(changes)
    return RawSamples(**fields)


def test_slices_track_and_clock_of_synthetic_samples():
    samples = check(synthetic())
    base = WALL - 5 * MS
    events = sampled_stacks.events(samples, base)
    meta = [e for e in events if e["ph"] == "M"]
    tid = TRACK_TID_BASE + 777
    assert meta[0] == {"ph": "M", "name": "thread_name", "pid": 4242, "tid": tid, "ts": 5000.0,
                       "args": {"name": f"{TRACK_NAME} · thread 777"}}
    assert meta[1]["name"] == "thread_sort_index" and meta[1]["args"] == {"sort_index": tid}
    xs = [(e["name"], e["ts"], e["ts"] + e["dur"], e["args"]["depth"], e["args"]["samples"], e["args"]["line"])
          for e in events if e["ph"] == "X"]
    assert xs == [("outer (sched.py:10)", 5000.0, 9000.0, 0, 4, 10),
                  ("first (sched.py:20)", 5000.0, 7000.0, 1, 2, 20),
                  ("second (sched.py:30)", 7000.0, 9000.0, 1, 2, 30)]
    assert all(e["cat"] == CATEGORY and e["pid"] == 4242 and e["tid"] == tid for e in events if e["ph"] == "X")
    assert len(xs) == samples.raw.events
    assert not [e for e in events if e["ph"] == "i"], "no stop event without a stop reason"
    assert sampled_stacks.events(samples, base, pid=7)[0]["pid"] == 7


def test_summary_of_synthetic_samples():
    summary = sampled_stacks.summary(check(synthetic(stop_reason="max_samples reached")))
    assert summary["samples"] == 4 and summary["achieved_hz"] == 1000.0 and summary["segments"] == 1
    assert summary["sampler_cpu_s"] == 0.001 and summary["sampler_cpu_share"] == 0.25
    assert summary["events"] == 3 and summary["estimated_bytes"] == 800 and summary["distinct_stacks"] == 2
    assert summary["stop_reason"] == "max_samples reached"
    assert summary["sampled_s"] == 0.004
    assert [(r["function"], r["line"], r["samples"]) for r in summary["top_self"]] == [
        ("first", 21, 2), ("second", 33, 1), ("second", 34, 1)]
    assert [(r["function"], r["line"], r["share"]) for r in summary["top_total"]] == [
        ("outer", 10, 1.0), ("first", 20, 0.625), ("second", 30, 0.375)]
    assert summary["weight_cap_ms"] == 100.0  # twenty switch intervals of the sampled process


def test_the_switch_interval_of_the_sampled_process_is_the_one_used():
    summary = sampled_stacks.summary(check(synthetic(switch_interval_s=0.02)))
    assert summary["weight_cap_ms"] == 400.0


def test_a_stop_forced_by_a_bound_ends_the_track_with_an_instant_event():
    events = sampled_stacks.events(check(synthetic(stop_reason="max_bytes reached")), WALL)
    [stop] = [e for e in events if e["ph"] == "i"]
    assert stop["name"] == "stack sampler stopped: max_bytes reached" and stop["ts"] == 4000.0
    assert stop["args"] == {"reason": "max_bytes reached", "samples": 4}


def test_no_samples_no_events():
    empty = synthetic(times=b"", stack_ids=b"", lines=b"", waits=b"", segments=[Segment(0, 0, 0, 0, (0, WALL), (0, WALL))])
    assert sampled_stacks.events(check(empty)) == []
    assert sampled_stacks.summary(check(empty))["samples"] == 0


def test_a_probes_dump_reads_back_as_it_was_sampled(tmp_path):
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            time.sleep(0.0005)

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    sampler = StackSampler(thread.ident)
    try:
        sampler.start()
        time.sleep(0.05)
        sampler.stop()
        path = samples_path(str(tmp_path / "engine_core-pid1.json"))
        assert path == str(tmp_path / "engine_core-pid1.stacks.msgpack")
        size = sampler.dump(path)
        in_memory = check(sampler.raw())
    finally:
        stop.set()
        thread.join(5)
        sampler.close()
    assert size == (tmp_path / "engine_core-pid1.stacks.msgpack").stat().st_size
    back = read(path)
    assert back.raw == in_memory.raw and back.stacks == in_memory.stacks
    assert len(back) == sampler.samples > 0 and back.raw.native_id == thread.native_id
    assert back.raw.switch_interval_s == sys.getswitchinterval() and back.raw.format == FORMAT
    assert sampled_stacks.summary(back) == sampled_stacks.summary(in_memory)
    assert sampled_stacks.events(back, WALL) == sampled_stacks.events(in_memory, WALL)
    assert sampled_stacks.track_tid(back) == TRACK_TID_BASE + thread.native_id


def test_a_file_written_in_the_other_byte_order_reads_the_same():
    raw = synthetic()
    other = "big" if sys.byteorder == "little" else "little"

    def swapped(data: bytes, typecode: str) -> bytes:
        column = array(typecode, data)
        column.byteswap()
        return column.tobytes()

    foreign = msgspec.structs.replace(
        raw, byteorder=other, times=swapped(raw.times, "q"), waits=swapped(raw.waits, "q"),
        stack_ids=swapped(raw.stack_ids, "i"), lines=swapped(raw.lines, "i"),
        stack_frames=swapped(raw.stack_frames, "i"), stack_ends=swapped(raw.stack_ends, "i"))
    mine, theirs = decode(encode(raw)), decode(encode(foreign))
    assert list(theirs.times) == list(mine.times) and theirs.stacks == mine.stacks
    assert sampled_stacks.events(theirs, WALL) == sampled_stacks.events(mine, WALL)


@pytest.mark.parametrize("change, problem", [
    (dict(format=FORMAT + 1), "format"),
    (dict(byteorder="middle"), "byte order"),
    (dict(period_ns=0), "positive"),
    (dict(times=b"\0" * 9), "whole number"),
    (dict(lines=array("i", [1, 2, 3]).tobytes()), "different lengths"),
    (dict(cut_frame=9), "cut_frame"),
    (dict(stack_frames=array("i", [2, 1, 3, 7]).tobytes()), "frame table"),
    (dict(stack_ends=array("i", [3, 2]).tobytes()), "stack_ends"),
    (dict(stack_ends=array("i", [2]).tobytes()), "beyond the last stack"),
    (dict(stack_ids=array("i", [0, 0, 1, 2]).tobytes()), "stack table"),
    (dict(segments=[Segment(0, 5, 0, 0, (0, 0), (0, 0))]), "segment"),
    (dict(segments=[Segment(0, 3, 0, 0, (0, 0), (0, 0))]), "outside every segment"),
])
def test_a_corrupt_file_is_refused_naming_the_problem(change, problem):
    with pytest.raises(SamplesFormatError, match=problem):
        decode(encode(synthetic(**change)))


@pytest.mark.parametrize("data", [b"", b"not msgpack", encode(synthetic())[:-7], msgspec.msgpack.encode({"format": 1})])
def test_what_is_not_a_samples_file_is_refused(data):
    with pytest.raises(SamplesFormatError, match="not a samples file"):
        decode(data)
