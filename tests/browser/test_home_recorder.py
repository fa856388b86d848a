"""The home page's last minutes with real probes in a stand-in engine (tests/fake_engine.py), in
headless Chromium: the chart drawn from ``GET /recorder/timeline`` with a planted slow step marked and
its row shown on a click, the window selector, the stacks button, the refresh stopped while the tab is
hidden, and nothing asked of any other origin; a slow step's two actions (its window downloaded, the
next steps captured); the chart behind a token. The same page in front of real vLLM:
tests/browser/test_vllm_recorder_page.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from test_service import engines, wait_processes  # noqa: F401 (fixture and helper)

from .conftest import screenshot

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one browser for the module (conftest.py)


async def test_the_chart_marks_a_slow_step_and_shows_its_row(sidecar, engines, new_page):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--steps-then-idle", "30", "--slow-step-at", "20",
            "--slow-step-ms", "300")
    await wait_processes(client, 1)
    page, console = await new_page()
    timeline_reads: list[str] = []
    page.on("request", lambda r: timeline_reads.append(r.url) if "/recorder/timeline" in r.url else None)
    await page.goto(client.url + "/")
    slow = page.locator("#chart svg circle.slow")
    await slow.first.wait_for(timeout=30_000)  # drawn by a refresh once the step is recorded
    await slow.first.click()
    panel = page.locator("#step-panel")
    await panel.wait_for()
    text = await panel.inner_text()
    assert "step 20" in text and "batch" in text and "GC inside the step" in text, text
    assert await page.locator("#download-window").is_visible() and await page.locator("#capture-next").is_visible()
    # The captures and scans lists and the forms stay below.
    assert await page.locator("#captures").count() == 1 and await page.locator("#capture-form").count() == 1

    await page.locator("button[data-window='60']").click()
    await page.locator("button[data-window='60'][aria-pressed=true]").wait_for()
    await page.locator("#timeline-status", has_text="updated").wait_for()
    assert any("seconds=60&" in u for u in timeline_reads)

    await page.locator("#take-stacks").click()
    step_thread = page.locator("#stacks details.step-thread")
    await step_thread.first.wait_for()
    assert "(step thread)" in await step_thread.first.locator("summary").inner_text()
    assert await step_thread.first.locator("ol.frames li").count() >= 1

    # Hidden, the page stops asking; shown again, it asks at once.
    await page.evaluate("""() => { Object.defineProperty(document, 'visibilityState', {value: 'hidden', configurable: true});
                                   document.dispatchEvent(new Event('visibilitychange')); }""")
    await asyncio.sleep(0.5)
    asked = len(timeline_reads)
    await asyncio.sleep(4.0)  # longer than a refresh's period: none while hidden
    assert len(timeline_reads) == asked
    await page.evaluate("""() => { Object.defineProperty(document, 'visibilityState', {value: 'visible', configurable: true});
                                   document.dispatchEvent(new Event('visibilitychange')); }""")
    for _ in range(50):
        if len(timeline_reads) > asked:
            break
        await asyncio.sleep(0.1)
    assert len(timeline_reads) > asked
    await screenshot(page, "home-recorder-stand-in.png")
    assert console.problems() == []
    assert all(u.startswith((client.url, "data:")) for u in console.requests), console.requests


async def test_a_slow_steps_actions_download_its_window_and_capture_the_next_steps(sidecar, engines, new_page):
    from test_service import wait_final

    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--slow-step-at", "100", "--slow-step-ms", "200")
    await wait_processes(client, 1)
    page, console = await new_page()
    await page.goto(client.url + "/")
    slow = page.locator("#chart svg circle.slow")
    await slow.first.wait_for(timeout=30_000)
    # On a loaded host other steps are slow too and their marks can overlap this one: a click where it is
    # drawn shows whichever is on top, and the step is read back from the panel below.
    await slow.first.click(force=True)
    heading = await page.locator("#step-panel h3").inner_text()
    step = int(heading.split(": step ")[1].split(",")[0])

    # The window around the step, as the flight recorder's Perfetto trace, saved as a file.
    async with page.expect_download() as info:
        await page.locator("#download-window").click()
    download = await info.value
    assert download.suggested_filename.startswith("recorder-") and download.suggested_filename.endswith(".trace.json")
    trace = json.loads(Path(await download.path()).read_text())
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"] == f"step {step}"]
    assert len(slices) == 1 and slices[0]["dur"] >= 200_000  # its 200 ms, in µs
    await page.locator("#step-out.ok", has_text="Downloaded").wait_for()

    # The next 3 steps captured: POST /profile/start, the answer beside the button.
    await page.locator("#capture-steps").fill("3")
    await page.locator("#capture-next").click()
    started = page.locator("#step-out.ok", has_text="Started capture")
    await started.wait_for()
    capture_id = (await started.inner_text()).split()[2]
    status = await wait_final(client, capture_id)
    assert status["state"] == "done" and status["steps"] == 3, status
    await screenshot(page, "home-recorder-actions.png")
    assert console.problems() == []


async def test_behind_a_token_the_chart_is_drawn_once_the_token_is_given(sidecar, engines, new_page):
    token = "a-token-for-the-recorder-chart-0123"
    client = await sidecar(http_token=token)
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1, headers={"Authorization": f"Bearer {token}"})
    page, console = await new_page()
    resp = await page.goto(client.url + "/")
    assert resp.status == 401
    await page.locator("#token").fill(token)
    await page.locator("#token-form button").click()
    await page.locator("#timeline-status", has_text="updated").wait_for(timeout=30_000)
    await page.locator("#chart svg polyline.step-max").first.wait_for(timeout=30_000)
    assert all(token not in url for url in console.requests)
    assert console.problems(allowed=("status of 401",)) == []  # the first page, asked without the token
    timeline_answers = [u for u in console.requests if "/recorder/timeline" in u]
    assert timeline_answers  # asked with the header: none of them answered 401 (the status says "updated")
