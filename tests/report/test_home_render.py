"""The home page drawn from a state dict: every part present, the forms the API's own parameters,
and engine-given text (labels, hosts, reasons, trigger names) shown as text."""

from __future__ import annotations

import html

from sidecar.service.pages.forms import CAPTURE_NAMES, LEFT_OUT, SCAN_NAMES, capture_fields, form_names, scan_fields
from sidecar.service.pages.home import render_home
from sidecar.report.script import SCRIPT
from sidecar.service.jobs.params import KNOWN, SCAN_KNOWN

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
        "modules": [{"id": "m20261123-085748-53f178", "state": "done", "reason": None, "steps": 4,
                     "created_at": 1795236396.1, "forward_ms": 10.0,
                     "modules": [{"path": "model", "type": "Llama", "calls": 4, "total_ms": 10.0, "self_ms": 1.0,
                                  "share": 1.0, "self_share": 0.1},
                                 {"path": EVIL, "type": EVIL, "calls": 4, "total_ms": 6.5, "self_ms": 6.5,
                                  "share": 0.65, "self_share": 0.65}]},
                    {"id": "m20261123-085749-000000", "state": "failed", "reason": EVIL, "steps": 2,
                     "created_at": 1795236397.1, "modules": []}],
        "active_capture": "20261123-085749-000000", "active_scan": None, "active_modules": None,
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


def test_module_timings_are_listed_with_their_slowest_module():
    page = render_home(state())
    elements = parse(page)
    assert "modules" in {a.get("id") for _, a in elements.tags}
    links = {a["href"]: a for t, a in elements.tags if t == "a" and a.get("href", "").startswith("/modules/")}
    assert set(links) == {"/modules/m20261123-085748-53f178", "/modules/m20261123-085749-000000"}
    assert links["/modules/m20261123-085748-53f178"]["download"] == "m20261123-085748-53f178.json"
    text = "".join(elements.text)
    # The module with the most self time, not the model (the largest total): its name shown as text.
    assert f"{EVIL} ({EVIL}): 6.500 ms self, 65.0% of the forward" in text
    assert "model (Llama)" not in text
    assert text.count(EVIL) >= 3  # the failed job's reason too
    for marker in (*MARKERS, EVIL):
        assert marker not in page


def test_a_module_timings_headline_and_its_stop_button():
    job = {"id": "m20261123-085750-000000", "state": "timing", "reason": None, "steps": 3,
           "created_at": 1795236398.1, "headline": EVIL, "modules": []}
    page = render_home(state(modules=[job], captures=[], active_capture=None,
                             active_modules="m20261123-085750-000000"))
    text = "".join(parse(page).text)
    assert EVIL in text and EVIL not in page
    assert "module timing m20261123-085750-000000 running" in text
    assert 'data-post="/modules/stop"' in page and 'data-post="/profile/stop"' not in page
    live = [a for t, a in parse(page).tags if a.get("id") == "live"][0]
    assert "data-active" in live


def test_memory_snapshots_are_listed_with_their_peak_page_and_stop_button():
    done = {"id": "g20261123-085748-53f178", "state": "done", "reason": None, "steps": 3, "created_at": 1795236396.1,
            "peak": {"process": EVIL, "allocated_bytes": 3 * 2**20, "reserved_bytes": 4 * 2**20}}
    running = {"id": "g20261123-085749-000000", "state": "recording", "reason": None, "steps": 5,
               "created_at": 1795236397.1, "peak": None}
    page = render_home(state(memory=[running, done], captures=[], active_capture=None,
                             active_memory="g20261123-085749-000000"))
    elements = parse(page)
    assert "memory" in {a.get("id") for _, a in elements.tags}
    hrefs = {a["href"] for t, a in elements.tags if t == "a" and a.get("href", "").startswith("/memory/")}
    assert "/memory/g20261123-085748-53f178/page" in hrefs and "/memory/g20261123-085748-53f178" in hrefs
    text = "".join(elements.text)
    assert f"3.0 MiB allocated in {EVIL}" in text and EVIL not in page
    assert "memory snapshot g20261123-085749-000000 running" in text
    assert 'data-post="/memory/stop"' in page
    assert "data-active" in [a for t, a in elements.tags if a.get("id") == "live"][0]


def test_an_empty_sidecar_says_what_to_check():
    page = render_home(state(processes=[], captures=[], scans=[], modules=[], triggers=[], active_capture=None))
    assert "SIDECAR_ENDPOINT" in page and "No captures yet." in page and "No module timings yet." in page
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
