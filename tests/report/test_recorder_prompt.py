"""``GET /recorder`` opened by a browser (Grafana's span link) on a sidecar with a token: the token prompt
of the pages, marked as the flight recorder's download, where an API client keeps its JSON 401; without
a token the browser gets the recording as before. The download itself, in Chromium:
tests/browser/test_recorder_download.py."""

from __future__ import annotations

import time

from sidecar.report.document import policy
from sidecar.report.script import SCRIPT, csp_hash
from test_service import engines, sidecar, wait_processes  # noqa: F401 (fixtures and helpers)

from .markup_check import parse

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}  # what a browser's navigation sends
TOKEN = "a-token-for-the-recorder-tests-0123"
MARKER = "<script>window.__pwned=1</script>"


def _range(**extra: str) -> dict[str, str]:
    return {"format": "trace", "start_ms": f"{(time.time() - 30) * 1000:.1f}", "duration_ms": "30000", **extra}


async def test_with_a_token_a_browser_gets_the_prompt_for_the_download(sidecar):
    client = await sidecar(http_token=TOKEN)
    for headers in (HTML, {**HTML, "Authorization": "Bearer wrong-token-of-the-right-length"}):
        resp = await client.get("/recorder", params=_range(processes=MARKER), headers=headers)
        page = await resp.text()
        assert resp.status == 401 and resp.content_type == "text/html", page
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert resp.headers["Content-Security-Policy"] == policy(interactive=True) + "; frame-ancestors 'none'"
        assert resp.headers["Cache-Control"] == "no-store"
        elements = parse(page)
        [body] = [attrs for tag, attrs in elements.tags if tag == "body"]
        assert "data-locked" in body and "data-download" in body
        assert elements.scripts == [SCRIPT] and csp_hash(elements.scripts[0]) in resp.headers["Content-Security-Policy"]
        assert "flight recorder" in "".join(elements.text)
        assert [a.get("id") for t, a in elements.tags if t == "form"] == ["token-form"]
        markup = page.replace(SCRIPT, "")
        assert "__pwned" not in markup and "start_ms" not in markup  # nothing of the request is echoed
    # A HEAD of the same navigation: the same answer, without its body.
    resp = await client.head("/recorder", params=_range(), headers=HTML)
    assert resp.status == 401 and resp.content_type == "text/html"


async def test_every_other_client_keeps_the_json_401(sidecar):
    client = await sidecar(http_token=TOKEN)
    for headers in ({}, {"Accept": "application/json"}, {"Accept": "*/*"}):  # curl, the CLI, a script
        resp = await client.get("/recorder", params=_range(), headers=headers)
        assert resp.status == 401 and (await resp.json())["error"] == "unauthorized"
    # Only a read of the recorder itself: another method, or another path below it, is no download.
    resp = await client.post("/recorder", params=_range(), headers=HTML)
    assert resp.status == 401 and (await resp.json())["error"] == "unauthorized"
    for path in ("/recorder/x", "/stacks", "/requests"):
        resp = await client.get(path, headers=HTML)
        assert resp.status == 401 and (await resp.json())["error"] == "unauthorized", path


async def test_with_the_token_or_without_one_the_recording_is_served_as_before(sidecar, engines):
    for token in (TOKEN, None):
        client = await sidecar(http_token=token)
        auth = {"Authorization": f"Bearer {TOKEN}"} if token else {}
        engines(client.url, "worker", "--rank", "0")
        await wait_processes(client, 1, headers=auth)
        # A browser's navigation with the token (the page script's fetch asks for JSON; this asks for HTML).
        resp = await client.get("/recorder", params=_range(), headers={**HTML, **auth})
        assert resp.status == 200 and resp.content_type == "application/json", await resp.text()
        assert "traceEvents" in await resp.json()
        # A range the recorder cannot hold: the API's 400, JSON, for the browser as for anyone.
        old = await client.get("/recorder", params={"start_ms": f"{(time.time() - 7200) * 1000:.0f}"},
                               headers={**HTML, **auth})
        assert old.status == 400 and (await old.json())["param"] == "start_ms"
