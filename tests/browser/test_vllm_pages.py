"""The home page and a capture's report in front of real vLLM (the session's server, tests/conftest.py),
in headless Chromium: the engine's processes listed, the start form starting a real capture while
clients stream, the page following it to ``done``, and the report of that capture drawn from its
summary. These are the screenshots docs/report.md shows."""

from __future__ import annotations

import pytest

from sidecar.cli.client import SidecarClient

from .conftest import screenshot
from .form_steps import start_from_the_form, wait_done

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]  # one browser (conftest.py)


async def test_the_home_page_of_vllm_starts_a_capture_and_opens_its_report(vllm_stack, background_load, new_page):
    client = SidecarClient(vllm_stack.sidecar_url)
    page, console = await new_page()
    await page.goto(vllm_stack.sidecar_url + "/")
    assert await page.title() == "inference-sidecar"
    roles = sorted([await cell.inner_text() for cell in await page.locator("#processes tbody td:nth-child(2)").all()])
    assert roles == ["api_server", "engine_core", "worker"]

    # A capture needs working steps: clients stream while the form starts it and the page follows it.
    with background_load(vllm_stack, concurrency=2, duration_s=90) as load:
        capture_id = await start_from_the_form(page, 4)
        await wait_done(page, capture_id)
        load.stop()
    assert not load.join().failures
    status = client.status(capture_id)
    assert status["steps"] == 4 and status["state"] == "done", status  # the form's value reached the API
    row = page.locator("#captures tr", has_text=capture_id)
    assert status["headline"] in await row.inner_text()
    await screenshot(page, "home.png", docs=True)

    await row.get_by_role("link", name="report").click()
    await page.wait_for_url(f"**/profile/{capture_id}/report")
    assert await page.locator(".headline").inner_text() == status["headline"]
    summary = client.summary(capture_id)
    heads = [await h.inner_text() for h in await page.locator("#timeline h3").all()]
    assert len(heads) == len(summary["processes"]) >= 2, heads  # one timeline per engine process
    assert all(h.startswith(p["label"]) for h, p in zip(heads, summary["processes"])), heads
    steps = sum(len(p["steps"]) for p in summary["processes"])
    assert steps >= 8 and await page.locator("#timeline svg g.step").count() == steps  # 4 in the core and worker
    # The plugin's phase ranges: each step of the engine core and the worker split into its phases.
    own = [p for p in summary["anatomy"]["processes"] if not p["steps_of"]]
    assert await page.locator("#timeline svg g.phase-step").count() == sum(len(p["steps"]) for p in own) >= 8
    assert await page.locator("#anatomy").is_visible()
    assert await page.locator("#downloads a", has_text="merged trace").count() == 1
    assert await page.locator("#findings li").count() >= 2
    await screenshot(page, "report-capture.png", docs=True)
    assert console.problems() == []
    assert all(u.startswith((vllm_stack.sidecar_url, "data:")) for u in console.requests), console.requests

