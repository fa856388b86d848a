"""What a person does on the home page, as steps the browser tests share: fill in the start form and
submit it, then wait for the page (which refreshes itself while a job runs) to show the capture done."""

from __future__ import annotations

import re

ID = re.compile(r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")


async def start_from_the_form(page, steps: int, **fields: str) -> str:
    """Submit ``#capture-form`` with ``steps`` (and other text fields by name); the started capture's id."""
    form = page.locator("#capture-form")
    await form.locator("input[name=steps]").fill(str(steps))
    for name, value in fields.items():
        await form.locator(f"input[name={name}]").fill(value)
    await form.locator("button[type=submit]").click()
    out = form.locator("output")
    await out.locator("xpath=self::*[contains(@class, 'ok') or contains(@class, 'error')]").wait_for(timeout=30_000)
    text = await out.inner_text()
    assert "ok" in (await out.get_attribute("class")), text
    return ID.search(text).group(0)


async def wait_done(page, capture_id: str, timeout_s: float = 120) -> None:
    """The page refreshes its live section while the capture runs: wait for its row to say done."""
    row = page.locator("#captures tr", has_text=capture_id)
    await row.locator(".state-done").wait_for(timeout=timeout_s * 1000)
