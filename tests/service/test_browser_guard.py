"""What a web page in the user's browser sends is refused before any handler runs (browser_guard.py,
docs/security.md "A web page in the user's browser"): cross-site requests that would act, subresource
reads for another site, and DNS rebinding (a ``Host`` that is no name the sidecar serves). Clients that are
not browsers (curl, the CLI, Prometheus, the probes) send none of the headers and pass as before.

The headers here are the ones Chromium sends (tests/browser/test_cross_site.py drives a real one against
a real engine); with two answering fake probes connected, a request the guard lets through does start a
job, so "nothing started" is checked on the job lists, not inferred from a status.
"""

from __future__ import annotations

import json

import pytest

from sidecar.service.app import make_app
from sidecar.service.browser_guard import START_PATHS, host_allowed, split_host
from sidecar.service.routes.keys import CAPTURES, SCANS
from sidecar.service.openapi import route_operations

from test_fuzz_api import AnsweringProbe, service_settings

EVIL = "http://attacker.example:8787"
CROSS_IMG = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image",
             "Referer": EVIL + "/"}
CROSS_FORM = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate",
              "Sec-Fetch-Dest": "document", "Content-Type": "application/x-www-form-urlencoded"}
CROSS_NAVIGATION = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}


def _app(tmp_path, **overrides):
    settings = service_settings(tmp_path / "traces")
    if overrides:
        settings = type(settings)(**{**settings.__dict__, **overrides})
    return make_app(settings)


@pytest.fixture
async def sidecar(aiohttp_client, tmp_path):
    app = _app(tmp_path)
    client = await aiohttp_client(app)
    client.probes = [AnsweringProbe(app, "worker", 0), AnsweringProbe(app, "engine_core", None)]
    return client


def own_origin(client) -> str:
    return f"http://{client.server.host}:{client.server.port}"


async def refused(resp, status: int, error: str) -> dict:
    text = await resp.text()
    assert resp.status == status, text
    assert resp.content_type == "application/json", text
    body = json.loads(text)
    assert body["error"] == error and body["message"], body
    assert "Access-Control-Allow-Origin" not in resp.headers
    return body


def nothing_started(client) -> None:
    app = client.server.app
    assert app[CAPTURES].recent() == [] and app[CAPTURES].active is None
    assert app[SCANS].recent() == [] and app[SCANS].active is None


# -- cross-site requests that would act ----------------------------------------------------------------------

@pytest.mark.parametrize("method, path", [
    ("GET", "/profile/start?steps=3"), ("HEAD", "/profile/start?steps=3"), ("POST", "/profile/start?steps=3"),
    ("GET", "/sync/start?steps=3"), ("GET", "/modules/start?steps=3"),
    ("POST", "/profile/stop"), ("POST", "/sync/stop"), ("POST", "/modules/stop"),
    ("DELETE", "/triggers/t1"),
])
@pytest.mark.parametrize("headers", [
    CROSS_IMG,  # <img src=...>: no Origin, Sec-Fetch-Site says whose page it is
    {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"},  # fetch(..., {mode: "no-cors"})
    CROSS_NAVIGATION,  # a link or a redirect from another site: a navigation may not act
    {"Sec-Fetch-Site": "same-site"},  # another port or subdomain of the same site is another origin
    {"Origin": "null"},  # a sandboxed frame, a file:// page
    {"Origin": EVIL},  # a browser that sends Origin but no Fetch Metadata
    {"Referer": EVIL + "/page"},  # an old browser that sends neither: the Referer names the page
], ids=["img", "no-cors-fetch", "navigation", "same-site", "null-origin", "origin-only", "referer-only"])
async def test_a_cross_site_request_that_would_act_is_refused(sidecar, method, path, headers):
    resp = await sidecar.request(method, path, headers=headers)
    if method == "HEAD":
        assert resp.status == 403 and "Access-Control-Allow-Origin" not in resp.headers
    else:
        await refused(resp, 403, "cross_site_request")
    nothing_started(sidecar)


async def test_an_auto_submitted_form_from_another_site_is_refused(sidecar):
    resp = await sidecar.post("/profile/start", data=b"steps=3", headers=CROSS_FORM)
    body = await refused(resp, 403, "cross_site_request")
    assert "Origin" in body["message"]
    # The same form where a browser sends no Origin and no Fetch Metadata: its body type alone refuses it.
    resp = await sidecar.post("/profile/start", data=b"steps=3",
                              headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert "application/json" in (await refused(resp, 403, "cross_site_request"))["message"]
    resp = await sidecar.post("/triggers", data=b'{"rule": {}}', headers={"Content-Type": "text/plain"})
    await refused(resp, 403, "cross_site_request")
    nothing_started(sidecar)


async def test_a_browser_websocket_from_another_site_is_refused(sidecar):
    resp = await sidecar.get("/probe/ws", headers={
        "Origin": EVIL, "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="})
    await refused(resp, 403, "cross_site_request")


# -- what still works ---------------------------------------------------------------------------------------

async def test_curl_and_the_cli_still_start_and_stop(sidecar):
    # `curl 'localhost:8787/profile/start?steps=5'`: no browser header at all.
    resp = await sidecar.get("/profile/start?steps=5", headers={"Host": "localhost:8787"})
    assert resp.status == 202, await resp.text()
    resp = await sidecar.post("/profile/stop")
    assert resp.status == 200, await resp.text()
    resp = await sidecar.post("/sync/start", data=json.dumps({"steps": 2}), headers={"Content-Type": "application/json"})
    assert resp.status == 202, await resp.text()


async def test_the_pages_own_requests_still_act(sidecar):
    # What the home page's script sends: a same-origin fetch with a JSON body.
    resp = await sidecar.post("/profile/start", data=json.dumps({"steps": 3}), headers={
        "Origin": own_origin(sidecar), "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors",
        "Content-Type": "application/json"})
    assert resp.status == 202, await resp.text()
    # Typed into the address bar or opened from a bookmark: Sec-Fetch-Site is "none".
    resp = await sidecar.post("/profile/stop", headers={"Sec-Fetch-Site": "none"})
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize("path", ["/", "/profiles", "/healthz", "/metrics"])
async def test_a_link_from_another_site_still_opens_a_read(sidecar, path):
    # A Grafana panel's link to a capture's report: a top-level navigation, whose answer the linking page
    # never sees.
    resp = await sidecar.get(path, headers=CROSS_NAVIGATION)
    assert resp.status == 200, await resp.text()


@pytest.mark.parametrize("path", ["/stacks?seconds=60&hz=1000", "/stacks?mode=native", "/recorder?seconds=3600"])
async def test_a_link_from_another_site_cannot_make_the_engine_work(sidecar, path):
    # /stacks and /recorder are reads that cost the engine (a sampler, py-spy, a dump): acting, for the guard.
    await refused(await sidecar.get(path, headers=CROSS_NAVIGATION), 403, "cross_site_request")
    resp = await sidecar.get(path, headers={"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate"})
    assert resp.status != 403, await resp.text()  # typed into the address bar: served


async def test_with_a_token_a_link_to_the_recorder_from_another_site_reaches_only_the_prompt(aiohttp_client,
                                                                                             tmp_path):
    """Grafana's span link to /recorder: with a token, the guard lets the navigation through to the token
    check, whose answer is the prompt (the engine does nothing); everything else stays refused."""
    token = "a-long-enough-test-token-0123456789"
    app = _app(tmp_path, http_token=token)
    client = await aiohttp_client(app)
    probe = _QueryCountingProbe(app, "worker", 0)
    html = {**CROSS_NAVIGATION, "Accept": "text/html"}
    for site in ("cross-site", "same-site"):
        resp = await client.get("/recorder?format=trace&seconds=30", headers={**html, "Sec-Fetch-Site": site})
        assert resp.status == 401 and resp.content_type == "text/html", await resp.text()
        assert "data-download" in await resp.text()
    # Not a navigation, not asking for a page, another costly read, or presenting a token: refused as before.
    for path, headers in [("/recorder?seconds=30", CROSS_NAVIGATION), ("/recorder?seconds=30", {**html,
                          "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}), ("/stacks", html),
                          ("/recorder?seconds=30", {**html, "Authorization": f"Bearer {token}"})]:
        await refused(await client.get(path, headers=headers), 403, "cross_site_request")
    assert probe.queries == [], "no query reached the engine"
    # The count works: the same read with the token, from the sidecar's own page, asks the engine once.
    resp = await client.get("/recorder?seconds=30", headers={"Authorization": f"Bearer {token}",
                                                             "Sec-Fetch-Site": "same-origin"})
    assert resp.status != 403 and len(probe.queries) == 1, await resp.text()


class _QueryCountingProbe(AnsweringProbe):
    def __init__(self, app, role: str, rank: int | None) -> None:
        super().__init__(app, role, rank)
        self.queries: list = []

    def _answer_query(self, query):
        self.queries.append(query)
        return AnsweringProbe._answer_query(query)


@pytest.mark.parametrize("path", ["/profiles", "/stacks", "/recorder?seconds=5", "/metrics"])
@pytest.mark.parametrize("mode, dest", [("no-cors", "image"), ("cors", "empty"), ("navigate", "iframe"),
                                        ("no-cors", "script")])
async def test_another_sites_page_cannot_fetch_or_embed_a_read(sidecar, path, mode, dest):
    resp = await sidecar.get(path, headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": mode,
                                            "Sec-Fetch-Dest": dest, "Origin": EVIL})
    await refused(resp, 403, "cross_site_request")


# -- DNS rebinding ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/profiles", "/metrics", "/healthz", "/", "/requests", "/profile/start?steps=3"])
@pytest.mark.parametrize("host", ["attacker.example:8787", "attacker.example", "localhost.attacker.example",
                                  "127.0.0.1.nip.io:8787", "LOCALHOST.evil", "2130706433", "[::1", "[::1]evil.example"])
async def test_a_host_that_names_no_address_of_the_sidecar_is_refused(sidecar, host, path):
    # A rebinding page reaches 127.0.0.1 as "same origin" but still names its own host.
    body = await refused(await sidecar.get(path, headers={"Host": host}), 421, "host_not_allowed")
    assert host in body["message"] and "--allowed-host" in body["message"]
    nothing_started(sidecar)


@pytest.mark.parametrize("host", ["localhost", "localhost:8787", "LocalHost.:9999", "127.0.0.1", "127.0.0.1:1",
                                  "[::1]:8787", "[::1]", "10.0.0.7:8787", "[fe80::1]:80"])
async def test_loopback_names_and_ip_addresses_are_served(sidecar, host):
    resp = await sidecar.get("/profiles", headers={"Host": host})
    assert resp.status == 200, await resp.text()


async def test_allowed_hosts_are_served(aiohttp_client, tmp_path):
    client = await aiohttp_client(_app(tmp_path, allowed_hosts=("sidecar.monitoring.svc", "grafana-proxy")))
    for host in ("sidecar.monitoring.svc", "sidecar.monitoring.svc:8787", "Grafana-Proxy.:9000"):
        assert (await client.get("/profiles", headers={"Host": host})).status == 200
    await refused(await client.get("/profiles", headers={"Host": "grafana-proxy.evil:9000"}), 421, "host_not_allowed")


async def test_with_a_token_the_token_is_the_check_and_no_name_is_locked_out(aiohttp_client, tmp_path):
    # A rebinding page has no token; a health check, the token prompt, a scraper through a Service name
    # must not get 421 (nor a scraper with a wrong token: its answer is the 401 that says why).
    token = "a-long-enough-test-token-0123456789"
    client = await aiohttp_client(_app(tmp_path, http_token=token))
    name = {"Host": "vllm-sidecar.pods.example:8787"}
    assert (await client.get("/healthz", headers=name)).status == 200
    assert (await client.get("/profiles", headers=name)).status == 401
    assert (await client.get("/", headers={**name, "Accept": "text/html"})).status == 401  # the token prompt
    resp = await client.get("/metrics", headers={**name, "Authorization": f"Bearer {token}"})
    assert resp.status == 200


async def test_the_probe_channel_and_the_metric_push_are_left_to_their_own_proofs(sidecar):
    # A probe on another host dials the sidecar by a Service name: its HMAC, not the Host, is checked.
    resp = await sidecar.post("/v1/metrics", data=b"x", headers={"Host": "sidecar:8787",
                                                                 "Content-Type": "application/x-protobuf"})
    assert resp.status == 401, await resp.text()
    ws = await sidecar.ws_connect("/probe/ws", headers={"Host": "sidecar:8787"})
    await ws.close()


# -- the rules themselves ----------------------------------------------------------------------------------

def test_every_route_that_starts_on_get_is_known_to_the_guard(tmp_path):
    # Routes of any method ("*") start a job on GET; every other route acts only on POST or DELETE.
    app = _app(tmp_path)
    any_method = {r.resource.canonical for r in app.router.routes() if r.method == "*"}
    assert any_method == set(START_PATHS)
    # and no GET route but these acts: each other GET's operation is a read in the OpenAPI document.
    assert {p for m, p in route_operations(app) if m == "GET"} >= set(START_PATHS)


@pytest.mark.parametrize("value, expected", [
    ("localhost:8787", ("localhost", "8787")), ("[::1]:80", ("::1", "80")), ("[::1]", ("::1", None)),
    ("Example.COM.", ("example.com", None)), ("::1", ("::1", None)),
])
def test_split_host(value, expected):
    assert split_host(value) == expected


def test_an_allowed_name_is_allowed_on_any_port_and_nothing_like_it_is():
    assert host_allowed("proxy", ("proxy",)) and host_allowed("proxy:1", ("proxy",))
    assert not host_allowed("proxy.evil", ("proxy",)) and not host_allowed("xproxy:1", ("proxy",))
