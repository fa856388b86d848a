"""``GET /`` and ``GET /profile/{id}/report`` on a sidecar with real probes (tests/fake_engine.py): HTML
for a browser, the API's JSON errors for anything else, and the token rules of every endpoint."""

from __future__ import annotations

import asyncio
import os
import sys


from test_service import engines, sidecar, wait_final, wait_processes  # noqa: F401 (fixtures and helpers)

from .markup_check import parse

HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}  # what a browser's navigation sends
TOKEN = "a-token-for-the-page-tests-0123"


async def _capture(client, steps=2, headers=None):
    resp = await client.get("/profile/start", params={"steps": str(steps)}, headers=headers)
    assert resp.status == 202, await resp.text()
    return (await resp.json())["id"]


async def test_home_and_report_of_a_real_capture(sidecar, engines, tmp_path):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    engines(client.url, "engine_core")
    procs = await wait_processes(client, 2)
    capture_id = await _capture(client)
    status = await wait_final(client, capture_id)
    assert status["state"] == "done", status

    home = await client.get("/")
    assert home.status == 200 and home.content_type == "text/html"
    assert "frame-ancestors 'none'" in home.headers["Content-Security-Policy"]
    assert home.headers["Cache-Control"] == "no-store"
    page = await home.text()
    parse(page)
    for p in procs:
        assert p["label"] in page
    assert capture_id in page and f'href="/profile/{capture_id}/report"' in page

    report = await client.get(f"/profile/{capture_id}/report")
    assert report.status == 200 and report.content_type == "text/html"
    page = await report.text()
    elements = parse(page)
    assert status["headline"] in "".join(elements.text)
    hrefs = {a.get("href") for t, a in elements.tags if t == "a"}
    assert status["trace"] in hrefs and f"/profile/{capture_id}/summary" in hrefs
    assert all(status["files"][p["file"]] in hrefs for p in status["processes"] if p["file"])
    # Every link the report offers answers.
    for url in [h for h in hrefs if h and h.startswith("/profile/")]:
        assert (await client.get(url)).status == 200, url

    # The command line saves the same page (sidecar download ID --report).
    out = tmp_path / "saved" / "report.html"
    out.parent.mkdir()
    code, err = await _cli("download", capture_id, "--report", "-o", str(out), "--url", client.url)
    assert code == 0, err
    assert status["headline"] in "".join(parse(out.read_text(encoding="utf-8")).text)
    code, err = await _cli("download", "20990101-000000-abcdef", "--report", "-o", str(out), "--url", client.url)
    assert code != 0 and err.startswith("sidecar download: ") and len(err.strip().splitlines()) == 1, err


async def _cli(*args: str) -> tuple[int, str]:
    """``sidecar ARGS`` in a process of its own, off the loop that serves the sidecar it talks to."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "sidecar.cli", *args,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
                                                env={k: v for k, v in os.environ.items() if k != "SIDECAR_TOKEN"})
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, err.decode()


async def test_a_report_that_is_not_there_or_not_ready(sidecar, engines):
    client = await sidecar()
    resp = await client.get("/profile/20990101-000000-abcdef/report")
    assert resp.status == 404 and (await resp.json())["error"] == "not_found"  # an API client: JSON
    resp = await client.get("/profile/20990101-000000-abcdef/report", headers=HTML)
    assert resp.status == 404 and resp.content_type == "text/html" and "no capture" in await resp.text()
    assert (await client.get("/profile/..%2F..%2Fetc/report", headers=HTML)).status == 404

    engines(client.url, "worker", "--rank", "0", "--steps-then-idle", "0")  # connected, never steps: stays armed
    await wait_processes(client, 1)
    capture_id = await _capture(client, steps=5)
    resp = await client.get(f"/profile/{capture_id}/report")
    assert resp.status == 409 and (await resp.json())["error"] == "conflict"
    resp = await client.get(f"/profile/{capture_id}/report", headers=HTML)
    assert resp.status == 409 and "its report is ready when it ends" in await resp.text()
    assert (await client.post("/profile/stop")).status == 200


async def test_with_a_token_a_browser_is_asked_for_it_and_told_nothing(sidecar, engines):
    client = await sidecar(http_token=TOKEN)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    engines(client.url, "worker", "--rank", "0")
    [proc] = await wait_processes(client, 1, headers=auth)
    capture_id = await _capture(client, headers=auth)
    for _ in range(600):
        status = await (await client.get(f"/profile/{capture_id}", headers=auth)).json()
        if status["state"] == "done":
            break
        await asyncio.sleep(0.1)
    for path in ("/", f"/profile/{capture_id}/report"):
        resp = await client.get(path)  # an API client: the JSON 401 of every endpoint
        assert resp.status == 401 and (await resp.json())["error"] == "unauthorized"
        for headers in (HTML, {**HTML, "Authorization": "Bearer wrong-token-of-the-right-length"}):
            resp = await client.get(path, headers=headers)
            page = await resp.text()
            assert resp.status == 401 and resp.content_type == "text/html", path
            assert 'id="token-form"' in page and "data-locked" in page
            assert proc["label"] not in page and capture_id not in page and status["headline"] not in page
        resp = await client.get(path, headers={**HTML, **auth})
        assert resp.status == 200 and capture_id in await resp.text()
    # Only the pages answer a browser so: every other path keeps its JSON 401.
    resp = await client.get(f"/profile/{capture_id}", headers=HTML)
    assert resp.status == 401 and (await resp.json())["error"] == "unauthorized"
    resp = await client.get("/profile/nope/report", headers=HTML)
    assert resp.status == 401 and "data-locked" in await resp.text()  # whether it exists is not told either
