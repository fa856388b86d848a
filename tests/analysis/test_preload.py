"""``early_read``: ``sidecar analyze`` reads its trace in a child forked before numpy is imported. The
summary is the same as read here, an unreadable file gives the same error, and a child that fails or
is not needed leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.analysis import analyze_path, pair, preload
from sidecar.analysis.errors import TraceFormatError

from .conftest import trace_path

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


@pytest.fixture
def forked(monkeypatch):
    """A core to spare, whatever this host has; the reading process's pid noted in the data."""
    monkeypatch.setattr(pair, "_spare_core", lambda: True)
    read_columns = preload.read_columns

    def noting_pid(path):
        data = read_columns(path)
        data.members["read_by"] = os.getpid()
        return data

    monkeypatch.setattr(preload, "read_columns", noting_pid)


def test_the_reader_imports_no_numpy():
    # What lets the child read while the parent imports: nothing it needs loads numpy.
    code = "import sys, sidecar.analysis.preload, sidecar.analysis.cli; print(sorted(m for m in sys.modules if m.split('.')[0] == 'numpy'))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "plugins")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_largest_trace_reads_the_same_in_the_child(forked):
    path = trace_path("v100-train-large.json.gz")
    with preload.early_read(str(path)) as reader:
        data = reader.load(path)
    assert data.members.pop("read_by") != os.getpid(), "read in the child"
    here = preload.read_here(path)
    assert here.members.pop("read_by") == os.getpid()
    assert data.names == here.names and data.steps == here.steps and data.process_names == here.process_names
    assert list(data.threads) == list(here.threads)
    for mine, theirs in [(data.gpu, here.gpu), *zip(data.threads.values(), here.threads.values())]:
        for field in mine.__struct_fields__:
            assert getattr(mine, field).tolist() == getattr(theirs, field).tolist(), field
    assert (data.event_count, data.ignored_count, data.fractional_ts) == (here.event_count, here.ignored_count, here.fractional_ts)


def test_the_summary_is_the_same(forked):
    path = trace_path("a100-nccl-multistream.json.gz")
    with preload.early_read(str(path)) as reader:
        early = analyze_path(path, top_n=5, loader=reader.load)
    assert early == analyze_path(path, top_n=5)


def test_an_unreadable_file_raises_as_it_would_here(forked, tmp_path):
    path = tmp_path / "bad.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(TraceFormatError) as here:
        analyze_path(path)
    with pytest.raises(TraceFormatError) as early:
        with preload.early_read(str(path)) as reader:
            analyze_path(path, loader=reader.load)
    assert str(early.value) == str(here.value) and "gzip" in str(early.value)


def test_a_child_that_fails_is_replaced_by_a_read_here(forked, monkeypatch):
    parent = os.getpid()
    read_columns = preload.read_columns

    def fails_in_child(path):
        if os.getpid() != parent:
            raise RuntimeError("a fault of the reader's")
        return read_columns(path)

    monkeypatch.setattr(preload, "read_columns", fails_in_child)
    path = trace_path("a100-alexnet.json.gz")
    with preload.early_read(str(path)) as reader:
        data = reader.load(path)
    assert data.members["read_by"] == parent
    assert data.event_count > 0


def test_no_child_for_a_folder_or_without_a_spare_core(tmp_path, monkeypatch):
    assert preload.early_read(str(tmp_path)).path is None
    monkeypatch.setattr(pair, "_spare_core", lambda: False)
    assert preload.early_read(str(trace_path("a100-alexnet.json.gz"))).path is None


def test_a_child_whose_answer_is_not_taken_is_ended(forked):
    with preload.early_read(str(trace_path("v100-train-large.json.gz"))) as reader:
        pid = reader._pid
        assert pid is not None
    with pytest.raises(ChildProcessError):  # killed and reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)
