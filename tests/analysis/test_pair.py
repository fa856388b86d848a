"""``analyse_pair``: two traces read at once (B in a forked child) or one after the other, with the same
answers either way: the summaries, a TraceFormatError as its message, any other fault raised."""

from __future__ import annotations

import os

import pytest

from sidecar.analysis import analyze_path
from sidecar.analysis.diff import pair
from sidecar.analysis.reader.errors import TraceFormatError

from .conftest import trace_path


def _fake(path: str) -> dict:
    if path.startswith("bad"):
        raise TraceFormatError(path, "not a trace")
    if path.startswith("bug"):
        raise ValueError("a fault of the analyser's")
    return {"path": path, "pid": os.getpid()}


@pytest.fixture(params=["forked", "in turn"])
def mode(request, monkeypatch):
    if request.param == "forked" and not hasattr(os, "fork"):
        pytest.skip("no os.fork here")
    monkeypatch.setattr(pair, "spare_core", lambda: request.param == "forked")
    return request.param


def test_both_summaries_in_order(mode):
    (a, err_a), (b, err_b) = pair.analyse_pair("one", "two", _fake)
    assert (a["path"], b["path"], err_a, err_b) == ("one", "two", None, None)
    assert a["pid"] == os.getpid()
    assert (b["pid"] != os.getpid()) == (mode == "forked"), "B is read in a child only when forked"


def test_unreadable_input_is_a_message_on_either_side(mode):
    (a, err_a), (b, err_b) = pair.analyse_pair("bad-a", "bad-b", _fake)
    assert a is None and b is None
    assert (err_a, err_b) == ("bad-a: not a trace", "bad-b: not a trace")
    (_a, err_a), (b, err_b) = pair.analyse_pair("one", "bad-b", _fake)
    assert err_a is None and b is None and err_b == "bad-b: not a trace"


def test_a_fault_is_raised_not_hidden(mode):
    expected = RuntimeError if mode == "forked" else ValueError
    with pytest.raises(expected, match="a fault of the analyser's"):
        pair.analyse_pair("one", "bug", _fake)


def test_a_forked_summary_is_the_one_read_here(monkeypatch):
    if not hasattr(os, "fork"):
        pytest.skip("no os.fork here")
    monkeypatch.setattr(pair, "spare_core", lambda: True)
    path = str(trace_path("a100-alexnet.json.gz"))
    (a, _), (b, _) = pair.analyse_pair(path, path, lambda p: analyze_path(p, all_names=True))
    assert a == b
