"""``GET /profile/{a}/diff/{b}`` (docs/api.md): what changed from one finished capture to another.

Built from the two captures' saved summaries (summary.json), never from their traces: a diff costs
two small file reads, so it runs on the event loop. The summaries list only their top names, which
the diff says (docs/analysis.md, sidecar diff); ``sidecar diff`` of the downloaded traces lists all.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..export import safe_files
from ..jobs.captures import Capture
from ..jobs.states import FINAL
from .captures import CAPTURE_ROUTES
from ..jobs.params import _choice, _reject_unknown

DIFF_FORMATS = ("json", "text")


def _summary_of(request: web.Request, key: str) -> dict[str, Any]:
    """The saved summary of the capture named by path parameter ``key``: 404 for no such capture, 409
    for one without a summary (still running, or it ended without a trace), 410 for one removed."""
    capture: Capture = CAPTURE_ROUTES.job_or_404(request, key)
    if capture.state not in FINAL:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state}; its summary is not ready")
    if not capture.summary_file:
        raise web.HTTPConflict(text=f"capture {capture.id} is {capture.state} with no summary to compare "
                                    f"({capture.headline or 'no trace'})")
    try:  # by safe_files: a link swapped in for the summary is not followed
        with safe_files.open_capture_file(capture.dir, capture.summary_file) as file:
            return json.loads(file.read())
    except FileNotFoundError:
        raise web.HTTPGone(text=f"the summary of capture {capture.id} was removed") from None
    except (safe_files.NotInFolder, OSError, ValueError):
        raise web.HTTPNotFound(text=f"capture {capture.id} has no summary that can be read") from None


async def profile_diff(request: web.Request) -> web.Response:
    _reject_unknown(request.query, {"format"})
    fmt = _choice(request.query, "format", DIFF_FORMATS)
    before, after = _summary_of(request, "a"), _summary_of(request, "b")
    # The analyser is imported on first use, as the export's analysis is (sidecar/service/export/merge.py): not at start.
    from ...analysis.diff.changes import diff_summaries

    diff = diff_summaries(before, after)
    if fmt == "text":
        from ...analysis.diff.text import format_diff

        return web.Response(text=format_diff(diff))
    return web.json_response(diff)


def add_diff_routes(app: web.Application) -> None:
    app.add_routes([web.get("/profile/{a}/diff/{b}", profile_diff)])
