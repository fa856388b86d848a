"""The pages a person opens in a browser (docs/report.md): ``GET /``, the home page, and
``GET /profile/{id}/report``, a finished capture's report. Both are HTML drawn by sidecar/report.

Auth follows the API's rules: the middleware's token check covers these paths as every other. What
differs is the answer a browser gets without the token: ``unauthorized_page`` gives it a page that asks
for the token (and holds nothing of the page asked for), where an API client gets the JSON 401. The same
prompt answers a browser sent to ``GET /recorder`` (Grafana's span link, a file download): the page
script then fetches the recording with the token and saves it as a file. Errors likewise: a browser
(``Accept: text/html``) gets a short HTML page, anything else the API's JSON error.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any
from urllib.parse import quote

from aiohttp import web

from ...common.version import __version__
from ...report import Link, render_capture_report
from ...report.document import message_page, policy, token_prompt
from ..pages.home import render_home
from ...report.markup import size
from ..export import safe_files
from ..store.reader import FetchFailed
from ..jobs.captures import Capture, capture_url
from .captures import CAPTURE_ROUTES
from .jobs import ID
from ..jobs.states import FINAL
from .keys import CAPTURES, MEMORY, MODULES, REGISTRY, SCANS, SETTINGS, TRIGGERS
from ..jobs.params import known_roles
from .responses import error_code, json_error

HOME_PATH = "/"
REPORT_PATH = f"/profile/{ID}/report"
_PAGE = re.compile(r"/|/profile/[^/]+/report|/memory/[^/]+/page")
# Not a page but a file a browser is sent to (Grafana's trace view links a span to it): with a token,
# the prompt, whose script downloads it with the header (sidecar/report/script.py, fetchRecording).
RECORDER_PATH = "/recorder"


def is_page(request: web.Request) -> bool:
    return request.method in ("GET", "HEAD") and _PAGE.fullmatch(request.path) is not None


def wants_html(request: web.Request) -> bool:
    """A browser's navigation (and the page script's own fetches) ask for text/html; API clients do not."""
    return "text/html" in request.headers.get("Accept", "")


def is_download(request: web.Request) -> bool:
    """A browser's way to the flight recorder's file (``GET /recorder?format=trace&start_ms=...``)."""
    return request.method in ("GET", "HEAD") and request.path == RECORDER_PATH


def unauthorized_page(request: web.Request) -> web.Response | None:
    """For the auth middleware: the 401 a browser gets on a page, a form asking for the token (the page
    script then fetches the page with it), or on ``/recorder`` the same form for its download (the script
    fetches the recording with it and saves it as a file); None for every other request (the JSON 401).
    Nothing of the request is in the prompt: the script reads the range from its own URL."""
    if not wants_html(request):
        return None
    if is_download(request):
        prompt = token_prompt("the flight recorder's recording of this range", download=True)
    elif is_page(request):
        prompt = token_prompt("the home page" if request.path == HOME_PATH else
                              "this memory snapshot's page" if request.path.startswith("/memory/") else "this capture's report")
    else:
        return None
    return _html(prompt, status=401, headers={"WWW-Authenticate": 'Bearer realm="inference-sidecar"'})


def _html(text: str, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    # The document carries its policy in a <meta> (a report saved to a file keeps it); the header adds
    # what a <meta> cannot say: no framing.
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8", headers={
        "Content-Security-Policy": policy(interactive=True) + "; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store",
        **(headers or {})})


def _error(request: web.Request, status: int, message: str) -> web.Response:
    """A browser gets a page; an API client the JSON error every endpoint gives (docs/api.md, Errors)."""
    if wants_html(request):
        return _html(message_page(f"{status}: {error_code(status).replace('_', ' ')}", message), status=status)
    return json_error(status, error_code(status), message)


def home_state(app: web.Application) -> dict[str, Any]:
    """What the home page shows: the API's own JSON of each part."""
    captures, scans, modules, memory = app[CAPTURES], app[SCANS], app[MODULES], app[MEMORY]
    registry = app[REGISTRY]
    return {
        "version": __version__,
        "token": bool(app[SETTINGS].http_token),
        "max_steps": app[SETTINGS].max_steps,
        "roles": list(known_roles(registry.roles())),
        "processes": [c.to_json() for c in registry.all()],
        "captures": [c.to_json() for c in captures.recent()],
        "scans": [s.to_json() for s in scans.recent()],
        "modules": [m.to_json() for m in modules.recent()],
        "memory": [m.to_json() for m in memory.recent()],
        "triggers": [t.to_json() for t in app[TRIGGERS].all()],
        "active_capture": captures.active.id if captures.active else None,
        "active_scan": scans.active.id if scans.active else None,
        "active_modules": modules.active.id if modules.active else None,
        "active_memory": memory.active.id if memory.active else None,
    }


async def home(request: web.Request) -> web.Response:
    return _html(render_home(home_state(request.app)))


def capture_links(capture: Capture) -> list[Link]:
    url = capture_url(capture.id)
    links = []
    if capture.trace_file:
        links.append(Link(f"merged trace ({size(capture.trace_bytes)})", f"{url}/trace",
                          f"{capture.id}-{capture.trace_file}"))
    # A file name is the probe's: quoted into the path, so that it can only ever name a file of this capture.
    links += [Link(f"{p.label}: {p.file}", f"{url}/files/{quote(p.file, safe='')}", f"{capture.id}-{p.file}")
              for p in capture.processes if p.file]
    links.append(Link("summary (JSON)", f"{url}/summary", f"{capture.id}-summary.json"))
    links.append(Link("capture (JSON)", url, f"{capture.id}.json"))
    return links


def _render_report(capture: Capture) -> str:
    """The report's HTML; FileNotFoundError, safe_files.NotInFolder or OSError where its summary cannot be read."""
    with safe_files.open_capture_file(capture.dir, capture.summary_file) as file:  # no link followed
        summary = json.loads(file.read())
    status = capture.to_json()
    notes = [f"{capture.state}: {capture.reason}"] if capture.reason else []
    summary = {**summary, "warnings": notes + list(capture.notes) + list(summary.get("warnings", []))}
    subtitle = f"{status['state']} · {status['steps']} steps · " + ", ".join(p.label for p in capture.processes)
    return render_capture_report(summary, title=f"Capture {capture.id}", subtitle=subtitle,
                                 downloads=capture_links(capture), interactive=True, capture=status)


async def report(request: web.Request) -> web.Response:
    capture: Capture | None = CAPTURE_ROUTES.find(request)
    if capture is None:
        return _error(request, 404, CAPTURE_ROUTES.not_found(request.match_info["id"]))
    if capture.state not in FINAL:
        return _error(request, 409, f"capture {capture.id} is {capture.state}; its report is ready when it ends")
    if not capture.summary_file:
        return _error(request, 404, f"capture {capture.id} has no summary ({capture.headline or 'no trace'})")
    try:  # a stored capture's summary is fetched back first (only in the store: sidecar serve --store)
        await request.app[CAPTURES].ensure_local(capture, capture.summary_file)
    except FetchFailed as exc:
        return _error(request, 502, f"the summary of capture {capture.id} could not be fetched from the store: {exc}")
    try:  # off the event loop: a thousand-step summary is megabytes of JSON, and heartbeats must not wait
        return _html(await asyncio.to_thread(_render_report, capture))
    except FileNotFoundError:
        return _error(request, 410, f"the summary of capture {capture.id} was removed")
    except (safe_files.NotInFolder, OSError, ValueError):
        return _error(request, 404, f"capture {capture.id} has no summary that can be read")


def add_page_routes(app: web.Application) -> None:
    app.add_routes([web.get(HOME_PATH, home), web.get(REPORT_PATH, report)])
