"""One trace read by two processes (sidecar/analysis/reader/halves.py): the head in a forked child, the tail
here. The joined result must be what a reading in one go gives, field for field; a cut that is not
between two events of ``traceEvents`` must be noticed (and the file read in one go); errors must be
those of a reading in one go."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from sidecar.analysis.reader import halves
from sidecar.analysis import summary
from sidecar.analysis.reader.collect import TraceData
from sidecar.analysis.reader.errors import TraceFormatError

from . import synth
from .conftest import trace_path

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


@pytest.fixture(autouse=True)
def _two_cores(monkeypatch):
    """The tests' own process may run a helper thread; the child only decodes, holding no lock of it."""
    monkeypatch.setattr(halves, "spare_core", lambda: True)


def assert_same(got: TraceData, want: TraceData) -> None:
    for field in want.__struct_fields__:
        a, b = getattr(got, field), getattr(want, field)
        if field == "gpu":
            _same_columns(a, b, field)
        elif field == "threads":
            assert list(a) == list(b), "threads in the order first seen"
            for key in b:
                _same_columns(a[key], b[key], f"thread {key}")
        else:
            assert a == b, field


def _same_columns(a, b, what: str) -> None:
    for name in b.__struct_fields__:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}.{name}"
        assert x.flags.writeable, f"{what}.{name}: writable, as a reading in one go gives it"


def assert_reaped(pid: int) -> None:
    """``pid`` is no child of this process any more (other tests may leave children of their own: a
    session's vLLM server, say)."""
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def read_in_halves(path: Path, share: float) -> TraceData | None:
    head = halves.start_head(path, share=share, min_text_bytes=0)
    assert head is not None
    return halves.load(str(path), head)


@pytest.mark.parametrize("name, share", [("v100-train-large.json.gz", 0.6), ("v100-train-large.json.gz", 0.15),
                                         ("a100-train-step.json.gz", 0.6), ("a100-nccl-multistream.json.gz", 0.9),
                                         ("a100-train-queue-rank0.json.gz", 0.5)])
def test_recorded_traces_read_in_halves_are_read_as_in_one_go(name, share):
    path = trace_path(name)
    got = read_in_halves(path, share)
    assert got is not None, "the cut of a recorded trace falls between two events"
    assert_same(got, summary.load(path))


def _events(n: int = 600) -> list[dict]:
    """Ops on two threads, kernels, steps and process names: every column and id the join renumbers."""
    events = [synth.process_name(synth.PID, "worker")]
    for i in range(n):
        ts = 10.0 * i
        events.append(synth.op(f"op{i % 37}", ts, 4, tid=synth.TID + i % 2))
        events.append(synth.runtime("cudaLaunchKernel", ts + 1, 1, corr=i))
        events.append(synth.kernel(f"kernel{i % 23}", ts + 2, 3, corr=i, stream=7 + i % 3))
        if i % 100 == 0:
            events.append(synth.step(i // 100, ts, 1000))
    events.append(synth.process_name(synth.PID, "worker (renamed)"))
    return events


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _share_at(path: Path, marker: str) -> float:
    """The share whose cut candidate is the first '}' of ``marker`` in the file."""
    text = path.read_bytes()
    at = text.index(marker.encode())
    assert at > len(text) // 10
    return at / len(text)


def _in_one_go_or_error(path: Path):
    try:
        return summary.load(path)
    except TraceFormatError as exc:
        return str(exc)


def test_a_synthetic_trace_in_halves_at_many_cuts(tmp_path):
    path = synth.write(tmp_path / "t.json", _events(), distributedInfo={"rank": 3})
    want = summary.load(path)
    for share in (0.05, 0.3, 0.5, 0.77, 0.95):
        got = read_in_halves(path, share)
        assert got is not None, share
        assert_same(got, want)


def test_the_json_array_format(tmp_path):
    path = _write(tmp_path / "t.json", json.dumps(_events()))
    got = read_in_halves(path, 0.5)
    assert got is not None
    assert_same(got, summary.load(path))


def test_gzip_trailer_gives_the_text_size(tmp_path):
    path = synth.write(tmp_path / "t.json.gz", _events())
    got = read_in_halves(path, 0.5)
    assert got is not None
    assert_same(got, summary.load(path))


def _with_event(events: list[dict], at: int, event: dict) -> list[dict]:
    return events[:at] + [event] + events[at:]


@pytest.mark.parametrize("odd, marker", [
    ({"name": "x}, {y"}, "x}, {y"),  # a candidate inside a string
    ({"args": {"list": [{"a": 1}, {"b": 2}]}}, '{"a": 1}, {"b"'),  # inside a nested value
], ids=["in a string", "in a nested value"])
def test_a_cut_inside_an_event_is_noticed_and_the_file_read_in_one_go(tmp_path, odd, marker):
    event = {**synth.op("odd", 5.0, 1), **odd}
    path = synth.write(tmp_path / "t.json", _with_event(_events(), 900, event))
    share = _share_at(path, marker)
    assert read_in_halves(path, share) is None
    head = halves.start_head(path, share=share, min_text_bytes=0)
    assert_same(summary.load(path, head), summary.load(path))


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_cut_in_another_top_level_member_is_noticed(tmp_path, where):
    events = json.dumps(_events())
    devices = '[{"id": 0}, {"id": 1}]'
    text = (f'{{"deviceProperties": {devices}, "traceEvents": {events}}}' if where == "before"
            else f'{{"traceEvents": {events}, "deviceProperties": {devices}}}')
    path = _write(tmp_path / "t.json", text)
    share = text.index('{"id": 0}, {"id": 1}') / len(text)
    assert read_in_halves(path, share) is None
    head = halves.start_head(path, share=share, min_text_bytes=0)
    assert_same(summary.load(path, head), summary.load(path))


@pytest.mark.parametrize("at", [0.25, 0.75], ids=["in the head", "in the tail"])
def test_a_corrupt_event_is_the_error_of_a_reading_in_one_go(tmp_path, at):
    text = json.dumps({"traceEvents": _events()})
    bad = text.index('"dur"', int(len(text) * at))
    path = _write(tmp_path / "t.json", text[:bad] + '"dur": [1' + text[bad + len('"dur": 4'):])
    want = _in_one_go_or_error(path)
    assert isinstance(want, str) and "corrupt JSON" in want
    if at < 0.5:  # the head fails: the file is read in one go, which finds the error
        assert read_in_halves(path, 0.5) is None
    else:  # the head is whole: the tail's error stands
        with pytest.raises(TraceFormatError) as raised:
            read_in_halves(path, 0.5)
        assert str(raised.value) == want
    head = halves.start_head(path, share=0.5, min_text_bytes=0)
    with pytest.raises(TraceFormatError) as raised:
        summary.load(path, head)
    assert str(raised.value) == want


def test_a_truncated_file_is_the_error_of_a_reading_in_one_go(tmp_path):
    whole = synth.write(tmp_path / "whole.json.gz", _events(3000))
    path = tmp_path / "cut.json.gz"
    path.write_bytes(whole.read_bytes()[: whole.stat().st_size * 3 // 4])
    want = _in_one_go_or_error(path)
    assert isinstance(want, str) and "truncated" in want
    head = halves.start_head(path, share=0.3, min_text_bytes=0)
    assert head is not None, "the size is read from the end of the file, whatever it holds"
    with pytest.raises(TraceFormatError) as raised:
        summary.load(path, head)
    assert str(raised.value) == want


def test_a_child_killed_before_it_answers_means_a_reading_in_one_go(tmp_path, monkeypatch):
    path = synth.write(tmp_path / "t.json", _events())
    # The child waits until it is killed: left to read, it once answered before the kill reached it (a
    # fresh-clone run, the other core free) and the reading in two went through.
    monkeypatch.setattr(halves, "_read_head", lambda _path, _split: signal.pause())
    head = halves.start_head(path, share=0.5, min_text_bytes=0)
    pid = head._child._pid
    os.kill(pid, signal.SIGKILL)
    assert halves.load(str(path), head) is None
    assert_reaped(pid)


def test_a_fault_here_kills_and_reaps_the_child(tmp_path, monkeypatch):
    path = synth.write(tmp_path / "t.json", _events())

    def broken(*_args, **_kwargs):
        raise RuntimeError("a fault of the reader's")
        yield

    head = halves.start_head(path, share=0.5, min_text_bytes=0)
    pid = head._child._pid
    monkeypatch.setattr(halves, "tail_events", broken)
    with pytest.raises(RuntimeError, match="a fault of the reader's"):
        halves.load(str(path), head)
    assert_reaped(pid)
    head.cancel()  # again: nothing left to do


def test_no_second_reader_where_it_does_not_pay_or_cannot_run(tmp_path, monkeypatch):
    small = synth.write(tmp_path / "t.json", _events(10))
    assert halves.start_head(small) is None, "under MIN_TEXT_BYTES"
    assert halves.start_head(tmp_path) is None, "a folder"
    assert halves.start_head(tmp_path / "missing.json", min_text_bytes=0) is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert halves.start_head(fifo, min_text_bytes=0) is None, "a pipe: nothing read from it here"
    monkeypatch.setattr(halves, "spare_core", lambda: False)
    assert halves.start_head(small, min_text_bytes=0) is None, "one core, or another thread running"
