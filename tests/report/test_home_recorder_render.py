"""The home page's last minutes as the server writes them (the page script draws the chart into them):
at the top, the window buttons, the places the script fills, a stuck step already shown in red with
the engine's label as text, and the capture and scan lists still below."""

from __future__ import annotations

from sidecar.report.script import SCRIPT
from sidecar.service.pages.home import DEFAULT_WINDOW, WINDOWS, render_home

from .hostile import MARKERS
from .markup_check import parse
from .test_home_render import EVIL, state


def test_the_last_minutes_come_first_with_their_controls():
    page = render_home(state())
    elements = parse(page)
    ids = [a.get("id") for _, a in elements.tags if a.get("id")]
    assert ids.index("recorder") < ids.index("live") < ids.index("captures") < ids.index("scans")
    assert {"chart", "step-panel", "in-flight", "take-stacks", "stacks", "timeline-status", "stuck"} <= set(ids)
    buttons = [(a["data-window"], a["aria-pressed"]) for t, a in elements.tags if t == "button" and "data-window" in a]
    assert buttons == [(str(s), "true" if s == DEFAULT_WINDOW else "false") for s, _ in WINDOWS]
    chart = next(a for _, a in elements.tags if a.get("id") == "chart")
    assert chart["data-max-steps"] == "50"  # the capture action's bound
    assert elements.scripts == [SCRIPT]  # the one hashed script draws it
    assert "loadTimeline" in SCRIPT and "visibilityState" in SCRIPT and "innerHTML" not in SCRIPT


def test_a_stuck_step_is_shown_in_red_as_text():
    page = render_home(state())
    stuck = [a for t, a in parse(page).tags if t == "p" and a.get("class") == "stuck"]
    assert len(stuck) == 1
    assert all(marker not in page for marker in (*MARKERS, EVIL))
    assert "step 3 stuck for 9.0 s" in page
    quiet = render_home(state(processes=[{**state()["processes"][0], "stuck": None}]))
    assert not [a for t, a in parse(quiet).tags if t == "p" and a.get("class") == "stuck"]
