"""Unreadable input gives a TraceFormatError that names the file and the problem."""

from __future__ import annotations

import gzip
import json

import pytest

from sidecar.analysis import TraceFormatError, analyze_path

from . import synth

GOOD = [synth.step(1, 0, 100), synth.runtime("cudaLaunchKernel", 10, 5, 1), synth.kernel("k", 20, 30, 1)]


def _error(path) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        analyze_path(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)
    return info.value


def test_empty_file(tmp_path):
    path = tmp_path / "empty.json"
    path.write_bytes(b"")
    assert "empty file" in str(_error(path))


def test_whitespace_only_file(tmp_path):
    path = tmp_path / "blank.json"
    path.write_text("  \n\t ")
    assert "empty file" in str(_error(path))


def test_empty_gzip(tmp_path):
    path = tmp_path / "empty.json.gz"
    with gzip.open(path, "wb"):
        pass
    assert "empty file" in str(_error(path))


def test_truncated_json(tmp_path):
    whole = json.dumps({"traceEvents": GOOD})
    path = tmp_path / "cut.json"
    path.write_text(whole[: len(whole) - 40])
    assert "truncated" in str(_error(path))


def test_truncated_gzip_stream(tmp_path):
    source = synth.write(tmp_path / "whole.json.gz", GOOD * 200)
    path = tmp_path / "cut.json.gz"
    data = source.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert "truncated" in str(_error(path))


def test_truncated_recorded_trace(tmp_path):
    """A real trace cut in the middle of its traceEvents (a copy interrupted mid-write)."""
    from .conftest import trace_path

    text = gzip.decompress(trace_path("a100-nccl-multistream.json.gz").read_bytes())
    path = tmp_path / "cut.json"
    path.write_bytes(text[: len(text) // 3])
    message = str(_error(path))
    assert "truncated" in message and "traceEvents" in message


def test_corrupt_byte_in_the_middle(tmp_path):
    text = json.dumps({"traceEvents": GOOD * 50}).encode()
    middle = text.index(b'"dur"', len(text) // 2)
    path = tmp_path / "corrupt.json"
    path.write_bytes(text[:middle] + b"#" + text[middle + 1 :])
    message = str(_error(path))
    assert "corrupt JSON" in message
    assert f"at byte {middle}" in message


def test_corrupt_gzip_data(tmp_path):
    source = synth.write(tmp_path / "whole.json.gz", GOOD * 200)
    data = bytearray(source.read_bytes())
    for k in range(20, 60):
        data[k] ^= 0xFF
    path = tmp_path / "bad.json.gz"
    path.write_bytes(bytes(data))
    assert "gzip" in str(_error(path))


def test_binary_garbage(tmp_path):
    path = tmp_path / "garbage.json"
    path.write_bytes(bytes(range(7, 200)))
    assert "not JSON trace data" in str(_error(path))


def test_json_without_trace_events(tmp_path):
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"name": "not a trace", "items": [1, 2, 3]}))
    assert "no traceEvents array" in str(_error(path))


def test_trace_events_not_objects(tmp_path):
    path = tmp_path / "numbers.json"
    path.write_text(json.dumps({"traceEvents": [1, 2, 3]}))
    assert "not an object" in str(_error(path))


def test_trailing_garbage(tmp_path):
    path = tmp_path / "trailing.json"
    path.write_text(json.dumps({"traceEvents": GOOD}) + " extra")
    assert "after the end" in str(_error(path))


def test_missing_path(tmp_path):
    assert "no such file" in str(_error(tmp_path / "nope.json.gz"))


def test_folder_without_traces(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    assert "no .json or .json.gz" in str(_error(tmp_path))


def test_bad_file_in_a_folder_is_named(tmp_path):
    synth.write(tmp_path / "rank0.json", GOOD)
    (tmp_path / "rank1.json").write_text('{"traceEvents": [{"ph": "X", ')
    with pytest.raises(TraceFormatError) as info:
        analyze_path(tmp_path)
    assert "rank1.json" in str(info.value) and "truncated" in str(info.value)
