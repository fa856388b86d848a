"""The home page's last minutes in front of real vLLM serving the slow-token fixture model (the shared
``fixture_models`` stack, tests/shared_stacks.py), in headless Chromium: the chart draws the steps the
flight recorder holds (its buckets checked against ``/recorder``), a planted slow step is marked and its
row shown on a click, the requests in flight show a hung request, the watchdog's stuck step is shown in
red at the top, and the stacks button names the hung frame. The screenshots docs/report.md shows."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from sidecar.cli.client import SidecarClient

from .conftest import ARTEFACTS, DOCS_IMAGES, screenshot

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]  # one browser (conftest.py)


@pytest.fixture(scope="session")
def fixture_models(_shared_stacks):
    return _shared_stacks["fixture_models"]


@pytest.fixture
def slow_token_stack(fixture_models):
    return fixture_models.use()


def _complete(stack, prompt: list[int], max_tokens: int = 4) -> dict:
    from e2e.completions import complete  # tests/e2e: the token-id completions of the fixture model

    return complete(stack, prompt, max_tokens)[1]


def _check_buckets(timeline: dict, recorder: dict) -> None:
    """Each process's buckets are the recorder's steps of the window, counted by the bucket of their start."""
    by_label = {p["process"]["label"]: p for p in recorder["processes"]}
    since, size = timeline["since_ns"], timeline["bucket_ns"]
    checked = 0
    for view in timeline["processes"]:
        steps = [s for s in by_label[view["process"]["label"]]["steps"]
                 if s["end_ns"] >= since and s["start_ns"] <= timeline["until_ns"]]
        expected: dict[int, list[float]] = {}
        for s in steps:
            expected.setdefault(since + max(0, (s["start_ns"] - since) // size) * size, []).append(s["duration_ms"])
        got = {b["start_ns"]: (b["steps"], b["max_ms"]) for b in view["buckets"]}
        assert got == {k: (len(v), max(v)) for k, v in expected.items()}, view["process"]["label"]
        checked += len(steps)
    assert checked > 0


async def _section_shot(page, name: str) -> None:
    """The page's last minutes alone (the section, not the forms below it): the test artefacts, and
    docs/images/ with SIDECAR_DOCS_SCREENSHOTS=1 (conftest.py ``screenshot``, for one element)."""
    await screenshot(page, name)  # the whole page among the artefacts
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTEFACTS / ("section-" + name)
    await page.locator("#recorder").screenshot(path=str(path))
    if os.environ.get("SIDECAR_DOCS_SCREENSHOTS") == "1":
        DOCS_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_IMAGES / name)


async def _shown(locator, timeout_s: float = 45.0) -> None:
    """Waits by locators: the page's CSP lets no evaluated string run (wait_for_function's polling)."""
    await locator.first.wait_for(timeout=timeout_s * 1000)


async def test_the_last_minutes_of_real_vllm_on_the_home_page(slow_token_stack, new_page):
    from slow_token_model import ENV_HANG_RELEASE, HANG_FUNCTION, HANG_TOKEN_ID, SLOW_SECONDS, SLOW_TOKEN_ID, prompt_ids

    stack = slow_token_stack
    client = SidecarClient(stack.sidecar_url, timeout=30)
    _complete(stack, [11, 12, 13, 14])
    sent = time.time_ns()
    await asyncio.to_thread(_complete, stack, prompt_ids(SLOW_TOKEN_ID, salt=40))  # one 1.5 s step
    page, console = await new_page()
    await page.goto(stack.sidecar_url + "/")
    await _shown(page.locator("#timeline-status", has_text="updated"))

    # The chart's data against the recorder's rows: the engine is idle now, so both hold the same steps.
    timeline = client.request("GET", "/recorder/timeline?seconds=600&points=300")
    recorder = client.request("GET", "/recorder?seconds=600")
    _check_buckets(timeline, recorder)
    worker = next(p for p in timeline["processes"] if p["process"]["role"] == "worker")
    planted = [s for s in worker["slow_steps"] if s["over"] and s["start_ns"] >= sent
               and s["duration_ms"] >= SLOW_SECONDS * 1000 * 0.9]
    assert len(planted) == 1, worker["slow_steps"][:3]
    step = planted[0]
    assert step["prefill_tokens"] >= 1 and step["batch"] >= 1

    # The planted step is marked on the page (the last minute, where it stands out); a click shows its row.
    await page.locator("button[data-window='60']").click()
    await page.locator("button[data-window='60'][aria-pressed=true]").wait_for()
    label = worker["process"]["label"]
    mark = page.locator("#chart svg circle.slow", has=page.locator("title", has_text=f"{label}: step {step['step']},"))
    await mark.wait_for(timeout=30_000)
    await mark.click()
    panel = page.locator("#step-panel")
    await panel.wait_for()
    shown = await panel.inner_text()
    assert f"{label}: step {step['step']}" in shown and "(slow)" in shown, shown
    assert "prefill tokens" in shown and "GC inside the step" in shown
    await _section_shot(page, "home-recorder-slow-step.png")

    # A hung engine: the request in flight, the watchdog's stuck step in red, the stacks naming the frame.
    release = Path(stack.env[ENV_HANG_RELEASE])
    release.unlink(missing_ok=True)
    hung = threading.Thread(target=_complete, args=(stack, prompt_ids(HANG_TOKEN_ID, salt=41), 2), daemon=True)
    try:
        hung.start()
        await _shown(page.locator("#in-flight-table tbody tr"))
        # The watchdogs at 3 s, reported at a heartbeat: the worker's (in the forward) and the engine
        # core's (waiting for the worker).
        await _shown(page.locator("#stuck p.stuck", has_text="worker"))
        row = await page.locator("#in-flight-table tbody tr").first.inner_text()
        assert "prefill" in row or "decode" in row, row
        await _section_shot(page, "home-recorder-hung.png")
        await page.locator("#take-stacks").click()
        frames = page.locator("#stacks details.step-thread ol.frames", has_text=HANG_FUNCTION)
        await frames.first.wait_for(timeout=30_000)
        await _section_shot(page, "home-recorder-stacks.png")
        assert hung.is_alive()  # hung all along
    finally:
        release.touch()
        await asyncio.to_thread(hung.join, 120)
        release.unlink(missing_ok=True)
    await asyncio.to_thread(_complete, stack, [11, 12, 13, 14])  # and it serves again
    assert console.problems() == []
    assert all(u.startswith((stack.sidecar_url, "data:")) for u in console.requests), console.requests
