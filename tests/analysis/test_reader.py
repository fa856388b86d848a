"""The streaming reader copes with what real trace files contain, and gives the same answer
whatever the layout of the JSON."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from sidecar.analysis import analyze_path
from sidecar.analysis.reader import stream

from . import synth
from .conftest import load_plain, trace_path

REFERENCE = "a100-nccl-multistream.json.gz"  # 40k events, ns timestamps, several streams, NCCL


def _essentials(summary: dict) -> dict:
    """What must not depend on how the file was written."""
    # Labels may differ: the array format has no distributedInfo to take a rank from.
    gpu = {**summary["gpu"], "devices": [{k: v for k, v in d.items() if k != "process"} for d in summary["gpu"]["devices"]]}
    return {
        "gpu": gpu,
        "steps": [{k: v for k, v in row.items() if k not in ("process", "rank")} for row in summary["steps"]],
        "syncs": summary["syncs"],
        "gaps": summary["gaps"]["by_cause"],
        "cpu": summary["cpu"]["top_ops"],
        "collectives": summary["collectives"],
    }


@pytest.fixture(scope="module")
def reference():
    path = trace_path(REFERENCE)
    return load_plain(path), _essentials(analyze_path(path))


def test_minified_plain_json(tmp_path, reference):
    trace, expected = reference
    path = tmp_path / "min.json"
    path.write_text(json.dumps(trace, separators=(",", ":")))
    assert _essentials(analyze_path(path)) == expected


def test_trace_events_first_and_metadata_after(tmp_path, reference):
    trace, expected = reference
    reordered = {"traceEvents": trace["traceEvents"], **{k: v for k, v in trace.items() if k != "traceEvents"}}
    path = tmp_path / "reordered.json.gz"
    with gzip.open(path, "wt") as fh:
        json.dump(reordered, fh, indent=2)
    assert _essentials(analyze_path(path)) == expected


def test_json_array_format(tmp_path, reference):
    trace, expected = reference
    path = tmp_path / "array.json"
    path.write_text(json.dumps(trace["traceEvents"]))
    assert _essentials(analyze_path(path)) == expected


def test_tiny_slices_exercise_every_boundary_path(tmp_path, reference, monkeypatch):
    """With 3 KiB slices nearly every slice ends mid-event or at the array's end."""
    trace, expected = reference
    path = tmp_path / "min.json"
    path.write_text(json.dumps(trace, separators=(",", ":")))
    monkeypatch.setattr(stream, "SLICE_BYTES", 3 << 10)
    assert _essentials(analyze_path(path)) == expected


def test_gzip_detected_by_content_not_name(tmp_path, reference):
    _, expected = reference
    path = tmp_path / "looks-plain.json"
    path.write_bytes(trace_path(REFERENCE).read_bytes())
    assert _essentials(analyze_path(path)) == expected


def test_concatenated_gzip_members(tmp_path):
    text = json.dumps({"traceEvents": [synth.kernel("k", 0, 10, 1), synth.kernel("k", 20, 10, 2)]}).encode()
    path = tmp_path / "two-members.json.gz"
    path.write_bytes(gzip.compress(text[:30]) + gzip.compress(text[30:]))
    assert analyze_path(path)["gpu"]["kernel_count"] == 2


def test_boundary_lookalikes_inside_strings_and_nested_args(tmp_path, monkeypatch):
    events = []
    for n in range(300):
        k = synth.kernel(f'weird }},{{"ph":"X"}}, {{ kernel {n} \u00e9\u6f22', n * 10, 5, n)
        k["args"]["nested"] = [{"a": 1}, {"b": [{"c": "}, {"}]}]
        events.append(k)
    path = tmp_path / "weird.json"
    path.write_text(json.dumps({"traceEvents": events}, ensure_ascii=False), encoding="utf-8")
    monkeypatch.setattr(stream, "SLICE_BYTES", 1 << 10)
    summary = analyze_path(path, top_n=1000)
    assert summary["gpu"]["kernel_count"] == 300
    assert {k["name"] for k in summary["gpu"]["top_kernels"]} == {e["name"] for e in events}


def test_missing_and_odd_fields(tmp_path):
    events = [
        {"ph": "X", "cat": "Kernel", "name": "old-style", "pid": 0, "tid": 7, "ts": 0, "dur": 10},  # no args, old category
        {"ph": "X", "cat": "kernel", "name": "string-ts", "pid": 0, "tid": 7, "ts": "20.5", "dur": "4.5", "args": {"device": 0, "stream": "0x7"}},
        {"cat": "kernel", "name": "no-dur", "pid": 0, "tid": 7, "ts": 40, "args": {"device": 0, "stream": 7}, "ph": "X"},  # ph last
        {"ph": "X", "cat": "kernel", "name": "unusable", "pid": 0, "tid": 7, "ts": [1], "dur": 3},
        {"ph": "X", "cat": "cpu_op", "name": 12345, "pid": "host", "tid": "main", "ts": 1, "dur": 2},
        {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1},  # no name, no ts
        {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3},
        {"name": "just a name"},  # no ph: not a trace event
        {"ph": "Z", "cat": "kernel", "name": "unknown phase", "pid": 0, "tid": 7, "ts": 50, "dur": 1},
        {"ph": "B", "cat": "cpu_op", "name": "begin", "pid": 1, "tid": 1, "ts": 4},  # kept category, not 'X'
    ]
    summary = analyze_path(synth.write(tmp_path / "odd.json", events), top_n=100)
    kernels = {k["name"]: k for k in summary["gpu"]["top_kernels"]}
    assert set(kernels) == {"old-style", "string-ts", "no-dur"}
    assert kernels["string-ts"]["total_us"] == 4.5 and kernels["no-dur"]["total_us"] == 0
    assert summary["gpu"]["devices"][0]["streams"][0]["stream"] == 7  # "0x7" read as 7
    # Skipped: ts [1], the entry without ph and the one with an unknown ph. Ignored: no ts, and 'B'.
    assert any("3 events skipped" in w for w in summary["warnings"]), summary["warnings"]
    assert any("2 events without a usable 'X' timestamp ignored" in w for w in summary["warnings"]), summary["warnings"]
    assert summary["cpu"]["top_ops"][0]["name"] == "12345"


def test_time_resolution_is_reported(summary_of):
    files = lambda name: summary_of(name)["source"]["files"][0]["time_resolution"]  # noqa: E731
    assert files("a100-nccl-multistream.json.gz") == "ns"
    assert files("v100-train-large.json.gz") == "us"


def test_nanosecond_durations_are_not_rounded(summary_of):
    """HTA rounds fractional microseconds away; the analyser keeps them (kernel of 1.76 us)."""
    top = summary_of("a100-triton.json.gz")["gpu"]["top_kernels"][0]
    assert top["total_us"] == 1.76


def test_memory_stays_bounded_on_a_large_trace(tmp_path):
    """A 215 MB trace (the largest shared one, four times over) is analysed in a fraction of its
    size: json.load alone would need several times the file."""
    text = gzip.decompress(trace_path("v100-train-large.json.gz").read_bytes())
    start = text.index(b"[", text.index(b'"traceEvents"')) + 1
    end = text.rindex(b"]")
    path = tmp_path / "big.json"
    with path.open("wb") as fh:
        fh.write(text[:start])
        fh.write(b",".join([text[start:end].strip()] * 4))
        fh.write(text[end:])
    size_mb = path.stat().st_size / 2**20
    # VmHWM, not ru_maxrss: Linux carries the pre-exec peak of a forked child over into
    # ru_maxrss, which would report the size of this pytest process instead.
    code = (
        "import re, sys; from sidecar.analysis import analyze_path; "
        "s = analyze_path(sys.argv[1]); "
        "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
        "print(s['gpu']['kernel_count'], int(hwm) / 1024)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout.split()
    assert int(out[0]) == 4 * 19370
    assert float(out[1]) < 0.6 * size_mb, f"peak RSS {out[1]} MB for a {size_mb:.0f} MB trace"
