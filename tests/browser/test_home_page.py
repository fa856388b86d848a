"""The home page of a live sidecar with real probes (tests/fake_engine.py), in headless Chromium: the
API's own error beside the form, the token asked for and kept out of every URL while the form starts
a capture the page follows to its report, and engine-given text shown without running. The same page
in front of real vLLM: tests/browser/test_vllm_pages.py."""

from __future__ import annotations

import gzip
import json

import pytest

from report.hostile import MARKERS, PROCESS  # tests/report
from sidecar.common.protocol import ProcessIdentity
from sidecar.service.routes.keys import REGISTRY
from test_service import engines, wait_processes  # noqa: F401 (fixture and helper)

from .conftest import screenshot
from .form_steps import start_from_the_form, wait_done

pytestmark = pytest.mark.asyncio(loop_scope="module")  # one browser for the module (conftest.py)

TOKEN = "a-token-for-the-browser-tests-0123"


class _NoSocket:
    """The probe channel of a process that is only listed: nothing is sent to it."""

    async def send_str(self, text: str) -> None:
        raise ConnectionResetError("not a real probe")

    async def close(self) -> None:
        pass


async def test_the_form_shows_the_apis_own_error(sidecar, engines, new_page):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    page, console = await new_page()
    await page.goto(client.url + "/")
    form = page.locator("#capture-form")
    await form.locator("input[name=processes]").fill("gpu")
    await form.locator("button[type=submit]").click()
    out = form.locator("output.error")
    await out.wait_for()
    assert (await out.inner_text()).startswith("processes: unknown role 'gpu'")
    assert await form.locator("input[name=processes]").get_attribute("aria-invalid") == "true"
    assert (await (await client.get("/profiles")).json())["captures"] == []  # nothing was started
    assert console.problems(allowed=("status of 400",)) == []


async def test_with_a_token_the_page_asks_for_it_and_keeps_it_out_of_urls(sidecar, engines, new_page):
    client = await sidecar(http_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    engines(client.url, "worker", "--rank", "0")
    [proc] = await wait_processes(client, 1, headers=auth)
    page, console = await new_page()
    await page.goto(client.url + "/")
    assert await page.locator("#token-form").is_visible()
    assert proc["label"] not in await page.content()
    await screenshot(page, "home-token.png")

    await page.locator("#token").fill("a-wrong-token-of-the-right-length")
    await page.locator("#token-form button").click()
    await page.locator("#token-form output.error").wait_for()
    assert await page.evaluate("sessionStorage.length") == 0  # a refused token is not kept

    await page.locator("#token").fill(TOKEN)
    await page.locator("#token-form button").click()
    await page.locator("#processes", has_text=proc["label"]).wait_for()
    capture_id = await start_from_the_form(page, 2)
    await wait_done(page, capture_id)

    # The report is a navigation: the sidecar asks again, the page script answers from sessionStorage.
    await page.locator("#captures tr", has_text=capture_id).get_by_role("link", name="report").click()
    await page.locator("#timeline").wait_for()
    # The trace link cannot carry the token: the script fetches it with the header and saves it.
    async with page.expect_download() as download:
        await page.locator("#downloads a", has_text="merged trace").click()
    saved = await (await download.value).path()
    assert json.loads(gzip.decompress(open(saved, "rb").read()))["traceEvents"]

    storage = await page.evaluate("({session: Object.keys(sessionStorage), local: localStorage.length})")
    assert storage == {"session": ["sidecar-token"], "local": 0}
    assert await page.context.cookies() == []
    assert all(TOKEN not in url for url in console.requests + [page.url]), console.requests
    # The sidecar refused what had no token (the first page, the report's navigation, the wrong token).
    assert console.problems(allowed=("status of 401",)) == []


async def test_engine_text_on_the_home_page_does_not_run(sidecar, new_page):
    client = await sidecar()
    # A process whose engine names itself in markup: registered as the probe channel would, no socket.
    evil = ProcessIdentity(role="worker", role_label=PROCESS, step_driven=True, pid=4242, rank=0,
                           host="<b onmouseover=alert(1)>host</b>", engine="<script>window.__pwned = 1</script>")
    client.server.app[REGISTRY].add(evil, _NoSocket())
    page, console = await new_page()
    await page.goto(client.url + "/")
    assert await page.evaluate("window.__pwned === undefined")
    shown = await page.locator("#processes").inner_text()
    assert PROCESS in shown and evil.host in shown and evil.engine in shown
    content = await page.content()
    assert all(m not in content for m in MARKERS)
    await screenshot(page, "home-hostile.png")
    assert console.problems() == []
