"""The home page drawn from a state dict: every part present, the forms the API's own parameters,
and engine-given text (labels, hosts, reasons, trigger names) shown as text."""

from __future__ import annotations

import html

from sidecar.report.forms import CAPTURE_NAMES, LEFT_OUT, SCAN_NAMES, capture_fields, form_names, scan_fields
from sidecar.report.home import render_home
from sidecar.report.script import SCRIPT
from sidecar.service.params import KNOWN, SCAN_KNOWN

from .hostile import MARKERS, PROCESS
from .markup_check import parse

EVIL = '<script>window.__pwned = "home"</script>'


def state(**overrides):
    base = {
        "version": "0.1.0", "token": False, "max_steps": 50, "roles": ["api_server", "engine_core", "worker"],
        "processes": [{"role": "worker", "pid": 7, "rank": 0, "label": PROCESS, "host": EVIL, "cuda": False,
                       "engine": EVIL, "last_step": 12, "step_rate": 3.5, "connected_at": 1.0, "last_seen": 2.0,
                       "open_step_ms": 1.5, "stuck": {"process": EVIL, "step": 3, "age_s": 9.0}}],
        "captures": [{"id": "20261123-085748-53f178", "state": "done", "reason": EVIL, "steps": 3,
                      "created_at": 1795236396.1, "headline": EVIL, "trace": "/profile/20261123-085748-53f178/trace",
                      "summary": "/profile/20261123-085748-53f178/summary", "trigger": {"name": EVIL},
                      "request": None},
                     {"id": "20261123-085749-000000", "state": "capturing", "reason": None, "steps": 5,
                      "created_at": 1795236397.1, "headline": None, "trace": None, "summary": None, "trigger": None,
                      "request": {"id": EVIL}}],
        "scans": [{"id": "s20261123-085748-53f178", "state": "failed", "reason": EVIL, "steps": 20,
                   "created_at": 1795236396.1, "hidden": 1, "expected": 2}],
        "triggers": [{"id": "trg-3f9a1c2e", "rule": {"name": EVIL, "metric": "ttft", "threshold_ms": 500.0,
                                                     "percentile": 95.0}, "counts": {"fired": 1, "skipped": 2},
                      "fired_last_hour": 1}],
        "active_capture": "20261123-085749-000000", "active_scan": None,
    }
    return {**base, **overrides}


def test_engine_text_is_shown_as_text():
    page = render_home(state())
    for marker in (*MARKERS, EVIL):
        assert marker not in page
    elements = parse(page)
    assert elements.scripts == [SCRIPT]
    assert [(t, a) for t, a in elements.tags if any(k.startswith("on") for k in a)] == []
    text = "".join(elements.text)
    assert EVIL in text and PROCESS in text


def test_every_part_and_the_links_of_a_finished_capture():
    page = render_home(state())
    ids = {a.get("id") for _, a in parse(page).tags}
    assert {"live", "processes", "captures", "scans", "triggers", "capture-form", "scan-form"} <= ids
    assert 'href="/profile/20261123-085748-53f178/report"' in page
    assert 'href="/profile/20261123-085749-000000/report"' not in page  # still capturing: no report yet
    live = [a for t, a in parse(page).tags if a.get("id") == "live"][0]
    assert "data-active" in live  # a job runs: the page script refreshes the live section
    assert "ttft p95 &gt; 500 ms" in page
    assert 'data-post="/profile/stop"' in page and 'data-post="/sync/stop"' not in page


def test_an_empty_sidecar_says_what_to_check():
    page = render_home(state(processes=[], captures=[], scans=[], triggers=[], active_capture=None))
    assert "SIDECAR_ENDPOINT" in page and "No captures yet." in page
    live = [a for t, a in parse(page).tags if a.get("id") == "live"][0]
    assert "data-active" not in live


def test_the_forms_offer_exactly_the_apis_parameters():
    assert form_names(capture_fields(50)) == CAPTURE_NAMES == KNOWN - LEFT_OUT
    assert form_names(scan_fields(50)) == SCAN_NAMES == SCAN_KNOWN
    page = render_home(state())
    forms = {a["id"]: a for t, a in parse(page).tags if t == "form"}
    assert forms["capture-form"]["data-api"] == "/profile/start" and forms["scan-form"]["data-api"] == "/sync/start"
    names = {a.get("name") for t, a in parse(page).tags if t in ("input", "select")}
    assert CAPTURE_NAMES | SCAN_NAMES <= names
    assert "1–50" in html.unescape(page)  # the ranges are the app's --max-steps
