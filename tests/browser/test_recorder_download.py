"""Grafana's span link to the flight recorder (``/recorder?format=trace&start_ms=...&duration_ms=...``)
opened in headless Chromium on a sidecar with a token and a stand-in engine (tests/fake_engine.py): the
token prompt, a refused token said so, the recording downloaded as a file once the token is given (and
on a click only, never on arrival, when this tab already holds it), the API's own error for a range the
recorder cannot hold, and the link followed from a page of another origin (as Grafana's is) reaching
the prompt rather than the browser guard's 403, with the engine asked nothing.
The answers header by header: tests/report/test_recorder_prompt.py."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from test_service import engines, wait_processes  # noqa: F401 (fixture and helper)

from .conftest import screenshot

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one browser for the module (conftest.py)

TOKEN = "a-token-for-the-recorder-download-0123"


async def _steps_recorded(client, auth) -> None:
    """Wait until the engine's recorder holds a few steps (the stand-in steps every few ms)."""
    for _ in range(100):
        resp = await client.get("/recorder", params={"seconds": "30"}, headers=auth)
        if resp.status == 200 and any(p["steps"] for p in (await resp.json())["processes"]):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the stand-in engine's recorder holds no step")


def _url(client, start_ms: float, fmt: str = "trace") -> str:
    return f"{client.url}/recorder?format={fmt}&start_ms={start_ms:.1f}&duration_ms=30000"


async def test_the_recorder_link_asks_for_the_token_and_downloads_the_trace(sidecar, engines, new_page):
    client = await sidecar(http_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1, headers=auth)
    await _steps_recorded(client, auth)
    start_ms = (time.time() - 30) * 1000
    page, console = await new_page()
    resp = await page.goto(_url(client, start_ms))
    assert resp.status == 401
    assert await page.locator("#token-form").is_visible()
    assert await page.evaluate("document.body.hasAttribute('data-download')")
    assert "flight recorder" in await page.locator("main").inner_text()
    await screenshot(page, "recorder-token.png")

    await page.locator("#token").fill("a-wrong-token-of-the-right-length")
    await page.locator("#token-form button").click()
    refused = page.locator("#token-form output.error")
    await refused.wait_for()
    assert await refused.inner_text() == "The sidecar refused this token."
    assert await page.evaluate("sessionStorage.length") == 0  # a refused token is not kept

    await page.locator("#token").fill(TOKEN)
    async with page.expect_download() as download:
        await page.locator("#token-form button").click()
    saved = await download.value
    assert saved.suggested_filename == f"recorder-{start_ms:.1f}.trace.json"
    trace = json.loads(open(await saved.path(), "rb").read())
    assert any(str(e.get("name", "")).startswith("step ") for e in trace["traceEvents"]), "the engine's steps"
    said = page.locator("#token-form output.ok")
    await said.wait_for()
    text = await said.inner_text()
    assert text.startswith(f"Downloaded recorder-{start_ms:.1f}.trace.json (") and text.endswith("B).")
    await screenshot(page, "recorder-downloaded.png")

    # This tab holds the token now: the next link asks only for a click (format=json: a .json file of rows).
    downloads = []
    page.on("download", lambda d: downloads.append(d))
    await page.goto(_url(client, start_ms, fmt="json"))
    held = page.locator("#token-form output")
    await page.wait_for_function("document.querySelector('#token-form output').textContent.includes('holds')")
    assert "press Download" in await held.inner_text()
    await asyncio.sleep(0.5)
    assert downloads == [], "nothing fetched on arrival"
    async with page.expect_download() as download:
        await page.locator("#token-form button").click()
    saved = await download.value
    assert saved.suggested_filename == f"recorder-{start_ms:.1f}.json"
    assert any(p["steps"] for p in json.loads(open(await saved.path(), "rb").read())["processes"])

    # A span older than the recorder's reach: the API's 400, naming start_ms, shown on the page.
    await page.goto(_url(client, (time.time() - 7200) * 1000))
    await page.locator("#token-form button").click()
    error = page.locator("#token-form output.error")
    await error.wait_for()
    said = await error.inner_text()
    assert said.startswith("start_ms: is 72") and "the flight recorder reaches back" in said, said
    await screenshot(page, "recorder-error.png")

    storage = await page.evaluate("({session: Object.keys(sessionStorage), local: localStorage.length})")
    assert storage == {"session": ["sidecar-token"], "local": 0}
    assert await page.context.cookies() == []
    assert all(TOKEN not in url for url in console.requests + [page.url]), console.requests
    assert console.problems(allowed=("status of 401", "status of 400")) == []


async def test_a_link_from_another_origin_reaches_the_prompt_and_the_engine_does_nothing(sidecar, engines,
                                                                                       new_page):
    """Grafana (another port: ``same-site`` to Chromium) links a span to the recorder: the guard lets this
    navigation through to the token prompt (a 401 page, not the 403 a costly read from another site
    gets), and no recorder query reaches the engine until the user gives the token there."""
    from aiohttp import web

    client = await sidecar(http_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1, headers=auth)
    link = _url(client, (time.time() - 30) * 1000)

    async def grafana(request):
        return web.Response(text=f'<a id="span" href="{link}">recorder</a>', content_type="text/html")

    app = web.Application()
    app.router.add_get("/", grafana)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        page, console = await new_page()
        await page.goto(f"http://127.0.0.1:{runner.addresses[0][1]}/")
        async with page.expect_navigation() as navigation:
            await page.locator("#span").click()
        resp = await navigation.value
        assert resp.status == 401, await resp.text()
        assert (await resp.request.all_headers()).get("sec-fetch-site") in ("same-site", "cross-site")
        assert await page.locator("#token-form").is_visible()
        processes = (await (await client.get("/processes", headers=auth)).json())
        assert processes, "the stand-in engine is connected"
        # The recorder was asked nothing: the prompt holds nothing of it, and the page made no fetch of it.
        assert not [url for url in console.requests if "/recorder" in url and url != link]
        async with page.expect_download() as download:
            await page.locator("#token").fill(TOKEN)
            await page.locator("#token-form button").click()
        assert (await download.value).suggested_filename.endswith(".trace.json")
    finally:
        await runner.cleanup()
