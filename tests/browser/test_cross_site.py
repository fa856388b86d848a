"""A web page in the user's browser against the sidecar of a real vLLM server (the session's stack), in
headless Chromium (docs/security.md, "A web page in the user's browser"; browser_guard.py).

Two pages of an attacker, both on names Chromium's ``--host-resolver-rules`` maps to 127.0.0.1:

- **cross-site**: a page on ``http://attacker.test:<port>`` fires at every state-changing route an ``<img>``
  GET, an auto-submitted form POST and a ``no-cors`` fetch (the trigger route a JSON body as text/plain),
  and tries a ``fetch`` read of the capture list and of a finished capture's trace. The same requests go
  to a *canary* (another origin on 127.0.0.1 that records what arrives): that the canary sees each one,
  marked cross-site, shows that Chromium delivers them to loopback, so it is the sidecar that refuses.
- **rebinding**: a page served at ``http://rebind.test:<the sidecar's port>/`` (as after its DNS name was
  re-pointed at 127.0.0.1) reads the sidecar "same-origin"; each answer must be the 421, not the data.

Meanwhile clients stream: nothing may start, nothing may be read, and no request of the engine may fail.
"""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from aiohttp import web

from sidecar.cli.client import SidecarClient

from .conftest import CHROMIUM, LAUNCH_ARGS, missing

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

ATTACKER = "attacker.test"
REBIND = "rebind.test"
# Every route that changes state, with the method a page can send it with (a form or no-cors fetch: GET or
# POST; DELETE is not a "simple" method, so a page cannot send it without a preflight nobody answers).
STARTS = ["/profile/start", "/sync/start", "/modules/start"]
STOPS = ["/profile/stop", "/sync/stop", "/modules/stop"]
TRIGGER_BODY = json.dumps({"rule": {"metric": "step_duration_s", "op": ">", "value": 0.001},
                           "action": {"capture_steps": 3}})

ATTACK_PAGE = """<!doctype html><meta charset="utf-8"><title>cute cats</title><body><script>
const targets = %(targets)s, starts = %(starts)s, stops = %(stops)s, triggerBody = %(trigger)s, reads = %(reads)s;
const results = {reads: {}};
const settle = [];
function img(url) {
  settle.push(new Promise(done => { const i = new Image(); i.onload = i.onerror = done; i.src = url; }));
}
function form(url, fields) {
  const name = "f" + Math.random().toString(36).slice(2);
  const frame = document.createElement("iframe"); frame.name = name; document.body.appendChild(frame);
  const f = document.createElement("form"); f.method = "POST"; f.action = url; f.target = name;
  for (const [k, v] of Object.entries(fields)) {
    const input = document.createElement("input"); input.name = k; input.value = v; f.appendChild(input);
  }
  document.body.appendChild(f);
  settle.push(new Promise(done => { frame.onload = done; setTimeout(done, 5000); }));
  f.submit();
}
function noCors(url, body, type) {
  const init = {mode: "no-cors", method: "POST", body: body};
  if (type) init.headers = {"Content-Type": type};
  settle.push(fetch(url, init).catch(() => null));
}
for (const base of targets) {
  for (const path of starts) { img(base + path + "?steps=3"); form(base + path + "?steps=3", {steps: "3"});
                               noCors(base + path + "?steps=3", "steps=3"); }
  for (const path of stops) { form(base + path, {}); noCors(base + path, ""); }
  noCors(base + "/triggers", triggerBody, "text/plain");
  for (const path of reads) {
    settle.push(fetch(base + path).then(r => r.text()).then(
      text => { results.reads[base + path] = {read: text.slice(0, 200)}; },
      err => { results.reads[base + path] = {error: String(err)}; }));
  }
}
Promise.all(settle).then(() => { window.results = results; });
</script>"""

REBIND_PAGE = """<!doctype html><meta charset="utf-8"><title>rebound</title><script>
const reads = %(reads)s, out = {};
Promise.all(reads.map(path => fetch(path).then(async r => { out[path] = {status: r.status, text: await r.text()}; },
                                               err => { out[path] = {error: String(err)}; })))
  .then(() => { window.results = out; });
</script>"""


class Canary:
    """Another origin on 127.0.0.1 that records every request that reaches it, and answers none usefully."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, dict[str, str]]] = []

    async def record(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path, dict(request.headers)))
        return web.Response(status=204)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def resolving_browser():
    """Chromium with the attacker's two names mapped to 127.0.0.1 (no DNS is reachable here)."""
    why = missing()
    if why:
        pytest.fail(why)
    from playwright.async_api import async_playwright

    rules = f"--host-resolver-rules=MAP {ATTACKER} 127.0.0.1, MAP {REBIND} 127.0.0.1"
    # Chromium's own guard of local addresses (Local/Private Network Access) refuses a page served from no
    # address (the rebinding page below) its fetches to loopback; Firefox and Safari have none, and a
    # policy can turn it off. Off here, so that what stops the pages is the sidecar, as for those browsers.
    no_lna = ("--disable-features=LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,"
              "PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults")
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS + [rules, no_lna])
        try:
            yield chromium
        finally:
            await chromium.close()


async def _serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


def _jobs(client: SidecarClient) -> dict:
    """What could have been started: every job list, and the triggers."""
    return {path: json.dumps(client.request("GET", path), sort_keys=True)
            for path in ("/profiles", "/syncs", "/modules", "/triggers")}


async def test_a_page_of_another_site_can_neither_drive_nor_read_the_sidecar(
        vllm_stack, background_load, resolving_browser):
    client = SidecarClient(vllm_stack.sidecar_url)
    sidecar = vllm_stack.sidecar_url
    port = urlsplit(sidecar).port
    with background_load(vllm_stack, concurrency=2, duration_s=120) as load:
        # A finished capture whose trace the pages will try to read.
        capture = client.wait(client.start(2)["id"], timeout=120)
        assert capture["state"] == "done", capture
        trace = f"/profile/{capture['id']}/trace"
        before = _jobs(client)

        canary = Canary()
        canary_app = web.Application()
        canary_app.router.add_route("*", "/{tail:.*}", canary.record)
        canary_runner, canary_port = await _serve(canary_app)
        page_app = web.Application()
        reads = ["/profiles", trace]
        attack = ATTACK_PAGE % {
            "targets": json.dumps([sidecar, f"http://127.0.0.1:{canary_port}"]), "starts": json.dumps(STARTS),
            "stops": json.dumps(STOPS), "trigger": json.dumps(TRIGGER_BODY), "reads": json.dumps(reads)}

        async def attack_page(request: web.Request) -> web.Response:
            return web.Response(text=attack, content_type="text/html")

        page_app.router.add_get("/", attack_page)
        page_runner, page_port = await _serve(page_app)
        context = await resolving_browser.new_context()
        try:
            page = await context.new_page()
            await page.goto(f"http://{ATTACKER}:{page_port}/")
            results = await _results(page)

            # The rebinding page: served at the sidecar's own port under the attacker's name, as after the
            # name was re-pointed; its fetches then reach the real sidecar, "same-origin" to the browser.
            rebind_reads = ["/profiles", "/processes", "/metrics", trace, "/healthz"]
            await context.route(f"http://{REBIND}:{port}/", lambda route: route.fulfill(
                status=200, content_type="text/html", body=REBIND_PAGE % {"reads": json.dumps(rebind_reads)}))
            page = await context.new_page()
            await page.goto(f"http://{REBIND}:{port}/")
            rebound = await _results(page)
        finally:
            await context.close()
            await page_runner.cleanup()
            await canary_runner.cleanup()

        after = _jobs(client)
        load.stop()
    assert not load.join().failures  # the engine served on through all of it

    # Chromium delivered the page's requests to loopback (the canary saw them, marked as another site's).
    cross = [(m, p) for m, p, h in canary.seen if h.get("Sec-Fetch-Site") == "cross-site"]
    for path in STARTS:
        assert ("GET", path) in cross and ("POST", path) in cross, canary.seen
    assert ("POST", "/triggers") in cross and all(("POST", p) in cross for p in STOPS), canary.seen
    # ...and the sidecar acted on none of them.
    assert after == before
    assert client.request("GET", "/healthz")["active_capture"] is None
    # Nothing was read: the cross-site reads fail in the browser (no CORS header), the rebound ones get 421.
    for path in reads:
        assert "error" in results["reads"][sidecar + path], results["reads"]
    for path in rebind_reads:
        answer = rebound[path]
        assert answer.get("status") == 421, (path, answer)
        assert json.loads(answer["text"])["error"] == "host_not_allowed"
        assert capture["id"] not in answer["text"] and "engine_core" not in answer["text"]


async def _results(page, timeout_s: float = 60) -> dict:
    for _ in range(int(timeout_s * 10)):
        results = await page.evaluate("window.results || null")
        if results is not None:
            return results
        await asyncio.sleep(0.1)
    raise AssertionError("the attacker's page did not finish its requests")
