"""More inputs for the reading in two processes (sidecar/analysis/reader/halves.py): each must give what a
reading in one go gives (the same TraceData, or the same error), reap its child and close its pipe."""

from __future__ import annotations

import gzip
import json
import os
import struct
import sys
from pathlib import Path

import pytest

from sidecar.analysis.reader import halves
from sidecar.analysis import summary
from sidecar.analysis.reader.errors import TraceFormatError
from sidecar.analysis.reader.stream import SLICE_BYTES, TopLevel
from sidecar.analysis.reader.stream_parts import Cut, tail_events

from . import synth
from .test_halves import assert_reaped, assert_same

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


@pytest.fixture(autouse=True)
def _two_cores(monkeypatch):
    monkeypatch.setattr(halves, "spare_core", lambda: True)


def _events(n: int = 400, pid=synth.PID) -> list[dict]:
    events = [synth.process_name(pid, "worker")]
    for i in range(n):
        ts = 10.0 * i
        events.append(synth.op(f"op{i % 17}", ts, 4, pid=pid, tid=synth.TID + i % 2))
        events.append(synth.runtime("cudaLaunchKernel", ts + 1, 1, corr=i, pid=pid))
        events.append(synth.kernel(f"kernel{i % 11}", ts + 2, 3, corr=i))
        if i % 100 == 0:
            events.append(synth.step(i // 100, ts, 1000, pid=pid))
    return events


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _halves(path, share: float):
    """``summary.load`` with a head forked at ``share``: the data, or the error's message."""
    head = halves.start_head(path, share=share, min_text_bytes=0)
    assert head is not None
    try:
        return summary.load(path, head)
    except TraceFormatError as exc:
        return str(exc)
    finally:
        head.cancel()


def _one_go(path):
    try:
        return summary.load(path)
    except TraceFormatError as exc:
        return str(exc)


def _same_outcome(path, shares) -> None:
    want = _one_go(path)
    for share in shares:
        got = _halves(path, share)
        if isinstance(want, str):
            assert got == want, share
        else:
            assert not isinstance(got, str), (share, got)
            assert_same(got, want)


def _share_at(text: str | bytes, marker: str | bytes) -> float:
    """The share whose split is the offset of ``marker`` (its first byte: the '}' of a candidate)."""
    if isinstance(text, str):
        text, marker = text.encode(), marker.encode()
    return (text.index(marker) + 0.5) / len(text)


def _with_raw_event(tmp_path, raw: str, at: int = 700) -> tuple[Path, str]:
    parts = [json.dumps(e) for e in _events()]
    text = '{"traceEvents": [' + ", ".join(parts[:at] + [raw] + parts[at:]) + "]}"
    path = tmp_path / "t.json"
    path.write_text(text)
    return path, text


def test_escaped_quotes_and_backslashes_before_a_candidate(tmp_path):
    # Inside the name: an escaped quote, then an escaped backslash and an escaped quote, each before a
    # '}, {'; the name and an args string end with an escaped backslash, so the '}}, {' after the event
    # is a true boundary.
    raw = (r'{"ph": "X", "cat": "cpu_op", "name": "a\"}, {\"b\\\"}, {\"c\\", "pid": 100, "tid": 100, '
           r'"ts": 5.0, "dur": 1, "args": {"s": "\\"}}')
    assert json.loads(raw)["name"] == 'a"}, {"b\\"}, {"c\\'
    path, text = _with_raw_event(tmp_path, raw)
    inside = [_share_at(text, r'}, {\"b'), _share_at(text, r'}, {\"c')]
    for share in inside:
        head = halves.start_head(path, share=share, min_text_bytes=0)
        assert halves.load(str(path), head) is None, "a cut inside a string is noticed"
    boundary = _share_at(text, r'"\\"}}, {') + len(r'"\\"}') / len(text)
    head = halves.start_head(path, share=boundary, min_text_bytes=0)
    assert halves.load(str(path), head) is not None, "the '}' after the event is a true boundary"
    _same_outcome(path, inside + [boundary])


@pytest.mark.parametrize("cut_in", ["first", "second"])
def test_duplicate_trace_events_keys(tmp_path, cut_in):
    a, b = json.dumps(_events(200)), json.dumps(_events(300, pid=7))
    text = (f'{{"traceName": "x", "traceEvents": {a}, "distributedInfo": {{"rank": 1}}, '
            f'"traceEvents": {b}, "traceName": "y", "schemaVersion": 2}}')
    path = tmp_path / "t.json"
    path.write_text(text)
    share = 0.25 if cut_in == "first" else 0.75
    _same_outcome(path, [share])
    got = _halves(path, share)
    assert got.members == {"traceName": "y", "distributedInfo": {"rank": 1}, "schemaVersion": 2}


def test_a_candidate_split_across_chunk_edges_and_whitespace_variants(tmp_path):
    # Events joined by "\n\t,\r\n ": the cut's '}' lies at the end of the first 1 MiB chunk, with the
    # rest of the candidate (its spaces, ',' and '{') in the next chunk or partly in this one.
    sep = "\n\t,\r\n "
    parts = [json.dumps(e) for e in _events(3000)]
    i = next(k for k in range(len(parts)) if len(sep.join(parts[:k])) > SLICE_BYTES - 3000)
    for back in (1, 2, 4, 6):  # the '}' is the chunk's last byte; then '}\n'; '}\n\t,'; all but '{'
        brace = SLICE_BYTES - back
        head = '{"traceEvents": [' + sep.join(parts[:i]) + sep
        pad = brace + 1 - len(head) - len(json.dumps({**synth.op("pad", 1, 1), "pad": ""}))
        body = head + json.dumps({**synth.op("pad", 1, 1), "pad": "x" * pad}) + sep + sep.join(parts[i:]) + "]}"
        assert body[brace] == "}" and body[brace + 1:brace + 8] == sep + "{"
        share = (brace + 0.5) / len(body)
        for path in (tmp_path / "t.json", tmp_path / "t.json.gz"):
            path.write_bytes(gzip.compress(body.encode()) if path.suffix == ".gz" else body.encode())
            cut = Cut()
            for _ in tail_events(str(path), TopLevel(), int(len(body) * share), cut):
                pass
            assert cut.at == brace + 1, back
            _same_outcome(path, [share])


def test_head_only_or_tail_only_columns(tmp_path):
    # GPU events only before the cut, host threads only after it (and the other way round): empty
    # columns go through the pipe, new threads and tracks are appended by the join.
    ops = [synth.op(f"op{i}", i, 1, tid=1 + i // 300) for i in range(600)]
    kernels = [synth.kernel(f"k{i % 5}", i, 1, corr=i, stream=i % 3) for i in range(600)]
    for events in (kernels + ops, ops + kernels, [synth.process_name(1, "a")] * 600 + kernels):
        path = synth.write(tmp_path / "t.json", events)
        _same_outcome(path, [0.3, 0.5, 0.7])


def test_process_names_and_tracks_with_pids_equal_across_types(tmp_path):
    first = [synth.process_name(1, "a"), synth.kernel("k", 1, 1, corr=1, pid=1)] * 300
    second = [synth.process_name(1.0, "b"), synth.kernel("k", 2, 1, corr=2, pid=1.0), synth.op("o", 1, 1, pid=1.0)] * 300
    path = synth.write(tmp_path / "t.json", first + second)
    _same_outcome(path, [0.25, 0.75])


def test_odd_field_types_around_the_cut(tmp_path):
    events = _events()
    odd = [{**synth.op("odd", 1, 1), "ts": True}, {**synth.op("odd", 1, 1), "args": []},
           {"ph": "Q"}, {**synth.op("odd", 1, 1), "ph": "X", "dur": 1e400}, {}]
    events = events[:800] + odd + [synth.op("x", 1, 1)] + odd + events[800:]
    path = synth.write(tmp_path / "t.json", events)
    text = path.read_text()
    at = text.index('"ts": true')
    shares = [(text.index("}, {", at + k * 40) + 0.5) / len(text) for k in range(12)]
    _same_outcome(path, shares)
    assert summary.load(path).skipped_count == 8


def test_deeply_nested_values_at_the_cut(tmp_path):
    # 900 levels in an event's args, the last event of the head: its exact path (the standard library)
    # reads it as the run decoder (msgspec) does in one go.
    raw = ('{"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 100, "tid": 100, "ts": 1, "dur": 1, "args": {"x": '
           + "[" * 900 + "]" * 900 + "}}")
    path, text = _with_raw_event(tmp_path, raw)
    at = text.index("]" * 900) + 901
    _same_outcome(path, [(at + 0.5) / len(text), 0.2, 0.8])


@pytest.mark.parametrize("text", ['{"traceEvents": []}', '{"traceEvents": [], "x": [{"a": 1}, {"b": 2}]}',
                                  '[]', '{"traceEvents": [{"ph": "X"}]}'])
def test_no_cut_in_the_events(tmp_path, text):
    path = tmp_path / "t.json"
    path.write_text(text)
    _same_outcome(path, [0.0, 0.5])


def test_events_only_after_a_long_member(tmp_path):
    big = json.dumps([{"id": i} for i in range(20000)])
    path = tmp_path / "t.json"
    path.write_text(f'{{"deviceProperties": {big}, "traceEvents": {json.dumps(_events(50))}}}')
    _same_outcome(path, [0.3, 0.9])


def test_a_bom_or_leading_whitespace(tmp_path):
    body = json.dumps(_events())
    for prefix in ("\ufeff", " " * (SLICE_BYTES + 5), "\n" * 10):
        for text in (prefix + body, prefix + json.dumps({"traceEvents": _events()})):
            path = tmp_path / "t.json"
            path.write_text(text, encoding="utf-8")
            _same_outcome(path, [0.5, 0.999])


@pytest.mark.parametrize("entry", ['3', '"x"', '[{"ph": "X"}]', 'null', '{"ph": "X"', '{"ph": "X"},,'])
@pytest.mark.parametrize("where", [0.2, 0.8])
def test_bad_entries_give_the_error_of_a_reading_in_one_go(tmp_path, entry, where):
    parts = [json.dumps(e) for e in _events()]
    k = int(len(parts) * where)
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [' + ", ".join(parts[:k] + [entry] + parts[k:]) + "]}")
    _same_outcome(path, [0.5])


@pytest.mark.parametrize("entry", ['3', '[{"a": 1}, {"b": 2}]', '{"ph": "X", "ts": [1}', '{"ph": "X"}}', '{"ph": 1}'])
def test_a_bad_entry_just_after_the_cut(tmp_path, entry):
    parts = [json.dumps(e) for e in _events()]
    text = '{"traceEvents": [' + ", ".join(parts[:700] + [entry] + parts[700:]) + "]}"
    path = tmp_path / "t.json"
    path.write_text(text)
    before = len('{"traceEvents": [' + ", ".join(parts[:700])) - 1  # the '}' of the event before the entry
    assert text[before] == "}"
    _same_outcome(path, [(before + 0.5) / len(text), (before - 40.5) / len(text)])


@pytest.mark.parametrize("tail", ["]", "]}}", "]} x", "], 3}", ', "traceName": }'])
def test_a_bad_end_gives_the_error_of_a_reading_in_one_go(tmp_path, tail):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": ' + json.dumps(_events())[:-1] + tail)
    _same_outcome(path, [0.5])


def test_gzip_variants(tmp_path):
    text = json.dumps({"traceEvents": _events(3000)}).encode()
    half = text.index(b"}, {", len(text) // 2) + 1
    cases = {
        "two members": gzip.compress(text[:half]) + gzip.compress(text[half:]),
        "trailer says 0": gzip.compress(text)[:-4] + struct.pack("<I", 0),
        "trailer says 4 GiB - 1": gzip.compress(text)[:-4] + struct.pack("<I", 2**32 - 1),
        "trailing garbage": gzip.compress(text) + b"garbage!",
    }
    whole = gzip.compress(text)
    for at in (0.3, 0.9):  # a corrupt byte of the deflate data before and after the cut
        k = int(len(whole) * at)
        cases[f"corrupt at {at}"] = whole[:k] + bytes([whole[k] ^ 0x55]) + whole[k + 1:]
    cases["crc"] = whole[:-8] + bytes([whole[-8] ^ 1]) + whole[-7:]
    for at in (0.1, 0.5, 0.9):  # the text ends before the cut, near it, after it
        cases[f"truncated at {at}"] = whole[: int(len(whole) * at)]
    for name, data in cases.items():
        path = tmp_path / "t.json.gz"
        path.write_bytes(data)
        _same_outcome(path, [0.2, 0.5, 0.8])


def test_the_pipe_is_closed_and_the_child_reaped(tmp_path):
    path = synth.write(tmp_path / "t.json", _events(3000))  # columns larger than a pipe's buffer
    before = _open_fds()
    head = halves.start_head(path, share=0.9, min_text_bytes=0)
    pids = [head._child._pid]
    assert summary.load(path, head) is not None
    head.cancel()
    head = halves.start_head(path, share=0.5, min_text_bytes=0)
    pids.append(head._child._pid)
    head.cancel()  # never read
    assert _open_fds() == before
    for pid in pids:
        assert_reaped(pid)


def test_unflushed_output_is_not_written_twice(tmp_path, capfd):
    path = synth.write(tmp_path / "t.json", _events())
    sys.stdout.write("once")  # no newline: still in the buffer at the fork
    head = halves.start_head(path, share=0.5, min_text_bytes=0)
    summary.load(path, head)
    sys.stdout.flush()
    assert capfd.readouterr().out == "once"


# --- Found by review of 0d0652f, fixed since -------------------------------------------------------


def test_the_path_is_the_one_a_reading_in_one_go_names(tmp_path, monkeypatch):
    # ``sidecar analyze ./t.json``: the head is forked with the path as typed, analyze_path reads
    # Path("./t.json"), which is "t.json"; the joined data must name the file as the reading in one go does
    # (the summary's processes[].file comes from it).
    monkeypatch.chdir(tmp_path)
    synth.write(tmp_path / "t.json", _events())
    head = halves.start_head("./t.json", share=0.5, min_text_bytes=0)
    got = summary.load(Path("./t.json"), head)
    assert got.path == summary.load(Path("./t.json")).path == "t.json"


def test_a_nan_pid_is_one_process_as_in_one_go(tmp_path):
    # json.dumps writes NaN and json.loads reads it (msgspec refuses it: the exact path); every NaN of
    # a reading in one go is the json module's one NaN object, so a NaN pid's events are one process
    # with its threads. Pickled through the pipe, the head's NaN is another object, equal to nothing:
    # the join makes each thread and the process name twice.
    nan = float("nan")
    events = _events(pid=nan)
    path = synth.write(tmp_path / "t.json", events)
    want = summary.load(path)
    assert len(want.threads) == 2
    got = _halves(path, 0.5)
    assert len(got.threads) == 2, list(got.threads)
    assert len(got.process_names) == len(want.process_names)


def test_an_ignored_sigchld_still_reads_the_file(tmp_path):
    # A parent (a supervisor, a shell script's trap) may start the CLI with SIGCHLD ignored, which is
    # inherited: the kernel then reaps the child itself and waitpid fails with ECHILD.
    import signal

    path = synth.write(tmp_path / "t.json", _events())
    want = summary.load(path)
    old = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        head = halves.start_head(path, share=0.5, min_text_bytes=0)
        got = summary.load(path, head)
    finally:
        signal.signal(signal.SIGCHLD, old)
    assert_same(got, want)


def test_a_fork_that_fails_means_a_reading_in_one_go(tmp_path, monkeypatch):
    # fork fails with EAGAIN (process limit) or ENOMEM: any doubt reads in one go, and the pipe is closed.
    path = synth.write(tmp_path / "t.json", _events())
    before = _open_fds()

    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    assert halves.start_head(path, share=0.5, min_text_bytes=0) is None
    assert _open_fds() == before


def _deep_event(depth: int) -> str:
    return ('{"ph": "X", "cat": "cpu_op", "name": "deep", "pid": 100, "tid": 100, "ts": 1, "dur": 1, "args": {"x": '
            + "[" * depth + "]" * depth + "}}")


@pytest.mark.parametrize("at", [100, 700], ids=["in the head", "in the tail"])
def test_nesting_too_deep_to_read_is_a_trace_format_error_either_way(tmp_path, at):
    # Both decoders count nesting against Python's recursion limit. Far past it, either reading names
    # the event (it was a RecursionError and a traceback). Near it the two-process reading, on shallower
    # stacks, may read an event a reading in one go refuses (docs/analysis.md says so).
    path, _text = _with_raw_event(tmp_path, _deep_event(5000), at)
    with pytest.raises(TraceFormatError, match="nested too deeply") as one_go:
        summary.load(path)
    head = halves.start_head(path, share=0.5, min_text_bytes=0)
    with pytest.raises(TraceFormatError) as in_halves:
        summary.load(path, head)
    assert str(in_halves.value) == str(one_go.value)


def test_a_top_level_number_across_a_chunk_edge(tmp_path):
    # A member's number split by the 1 MiB read ("baseTimeNanoseconds": 123|456) was read as 123 and
    # the rest refused as "expected ',' or '}'".
    events = json.dumps(_events())
    prefix = '{"padding": "' + "p" * (SLICE_BYTES - 40) + '", "baseTimeNanoseconds": '
    assert len(prefix) < SLICE_BYTES
    number = "1" * (SLICE_BYTES - len(prefix) + 5)  # runs past the first chunk's end
    path = tmp_path / "t.json"
    path.write_text(prefix + number + ', "traceEvents": ' + events + "}", encoding="utf-8")
    data = summary.load(path)
    assert data.members["baseTimeNanoseconds"] == int(number)


def test_a_bad_escape_in_a_member_name_is_a_trace_format_error(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b'{"bad\\x": 1, "traceEvents": []}')  # a backslash, then x: no such escape
    assert b"\\x" in path.read_bytes()
    with pytest.raises(TraceFormatError, match="member name"):
        summary.load(path)
