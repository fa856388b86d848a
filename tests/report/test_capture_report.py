"""The capture report (sidecar/report): every section from a real GPU trace, markup from a trace shown
as text and never run, a page that parses whole, and the policy that allows only its own script."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from sidecar.analysis import analyze_path
from sidecar.report import Link, render_capture_report, write_html_report
from sidecar.report.document import policy
from sidecar.report.script import SCRIPT, STYLE_HASH, csp_hash
from sidecar.report.styles import CSS

from .hostile import KERNEL, MARKERS, OP, PROCESS, write_trace
from .markup_check import parse

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
SHARED = sorted(TRACES.glob("*.json.gz")) if TRACES.is_dir() else []
needs_traces = pytest.mark.skipif(not SHARED, reason=f"no shared traces in {TRACES}")
SECTIONS = ("headline", "findings", "downloads", "timeline", "devices", "kernels", "ops", "gaps", "syncs",
            "collectives", "steps")


@pytest.fixture(scope="module")
def hostile_summary(tmp_path_factory):
    return analyze_path(write_trace(tmp_path_factory.mktemp("hostile") / "trace.json"))


def _no_markup_from_the_trace(page: str) -> None:
    for marker in MARKERS:
        assert marker not in page, marker
    elements = parse(page)
    assert [t for t, _ in elements.tags if t in ("img", "iframe", "object", "embed")] == []
    assert [(t, a) for t, a in elements.tags if any(k.startswith("on") for k in a)] == []
    assert all(s in ("", SCRIPT) for s in elements.scripts)


def test_a_script_in_a_kernel_name_is_text(hostile_summary):
    names = [k["name"] for k in hostile_summary["gpu"]["top_kernels"]]
    assert KERNEL in names, names
    page = render_capture_report(hostile_summary, downloads=[Link(KERNEL, "x.json.gz", PROCESS)])
    _no_markup_from_the_trace(page)
    text = "".join(parse(page).text)
    assert KERNEL in text and OP in text and PROCESS in text  # shown, as the characters they are


def test_the_interactive_page_carries_only_its_own_script(hostile_summary):
    page = render_capture_report(hostile_summary, interactive=True)
    _no_markup_from_the_trace(page)
    assert parse(page).scripts == [SCRIPT]
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1).replace("&#x27;", "'")
    assert csp == policy(True) and csp_hash(SCRIPT) in csp and STYLE_HASH in csp and "unsafe-inline" not in csp
    assert csp_hash(CSS) == STYLE_HASH and f"<style>{CSS}</style>" in page


def test_a_file_report_runs_no_script(hostile_summary):
    page = render_capture_report(hostile_summary)
    assert "<script" not in page and "script-src 'none'" in page.replace("&#x27;", "'")


@needs_traces
def test_a_gpu_trace_has_every_section_and_its_figures():
    summary = analyze_path(TRACES / "a100-train-queue-rank0.json.gz")
    page = render_capture_report(summary, downloads=[Link("trace", "t.json.gz", "t.json.gz")])
    elements = parse(page)
    ids = {a.get("id") for _, a in elements.tags}
    assert set(SECTIONS) <= ids, set(SECTIONS) - ids
    text = " ".join(elements.text)
    assert summary["headline"] in text
    assert "ui.perfetto.dev" in page and 'href="t.json.gz"' in page
    svgs = [a for t, a in elements.tags if t == "svg"]
    assert len(svgs) >= 5, "timeline, device busy, kernels, ops, gap causes"
    # The timeline draws every step of each process, and each of its largest gaps.
    steps = sum(len(p["steps"]) for p in summary["processes"])
    assert sum(1 for t, a in elements.tags if t == "g" and a.get("class") == "step") == steps
    gaps = sum(len(p["gaps"]["largest"]) for p in summary["processes"])
    assert sum(1 for t, a in elements.tags if t == "g" and a.get("class") == "gap") == gaps
    for k in summary["gpu"]["top_kernels"]:
        assert k["name"] in text  # the full names, in the table


@needs_traces
@pytest.mark.parametrize("trace", SHARED, ids=[p.name.split(".")[0] for p in SHARED])
def test_every_shared_trace_renders_whole(trace):
    summary = analyze_path(trace)
    page = render_capture_report(summary)
    parse(page)  # balanced
    assert summary["headline"] in html.unescape(page)


def test_write_html_report_links_the_trace_relative_to_the_report(tmp_path, hostile_summary):
    (tmp_path / "traces").mkdir()
    trace = write_trace(tmp_path / "traces" / "run 1.json")
    out = write_html_report(analyze_path(trace), tmp_path / "reports" / "r.html")
    page = out.read_text(encoding="utf-8")
    assert 'href="../traces/run%201.json"' in page
    parse(page)


def test_a_cpu_only_summary_says_so(tmp_path):
    trace = tmp_path / "cpu.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 10},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 20}]}))
    page = render_capture_report(analyze_path(trace))
    assert "No GPU kernels were recorded" in page and 'id="devices"' in page
    parse(page)


def test_the_phases_of_each_step_are_drawn_and_told(tmp_path):
    from analysis.synth import write  # tests/analysis: the step anatomy's hand-built trace
    from analysis.test_anatomy import NOTED, api_events, core_events, worker_events

    summary = analyze_path(write(tmp_path / "merged.json", core_events() + worker_events() + api_events(), **NOTED))
    page = render_capture_report(summary)
    elements = parse(page)
    ids = {a.get("id") for _, a in elements.tags}
    assert "anatomy" in ids
    # A phase mark per step of the engine core and the worker (4 each); the API server's phases are cut by
    # the core's steps, so it has its figures in the section but no marks on its own timeline.
    own = [p for p in summary["anatomy"]["processes"] if not p["steps_of"]]
    assert len(own) == 2
    marks = sum(1 for t, a in elements.tags if t == "g" and a.get("class") == "phase-step")
    assert marks == sum(len(p["steps"]) for p in own) == 8
    text = " ".join(elements.text)
    largest = summary["anatomy"]["largest"]
    assert f"The largest phase of a step is {largest['label']}" in text
    assert "during the steps of engine core (pid 10)" in html.unescape(page)
    # No kernels, no syncs in these steps: their lanes are left out rather than drawn empty.
    lanes = re.findall(r'text-anchor="end">([a-zA-Z ]+)</text>', page)
    assert lanes == ["steps", "phases"] * 2 + ["steps"], lanes  # core, worker, then the API server
