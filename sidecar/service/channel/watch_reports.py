"""A probe's always-on sync watch report (``Heartbeat.sync_watch``, sidecar/syncs/watch.py) checked
for the shape its readers rely on before the registry keeps it.

The protocol types the field loosely (a JSON object), and two readers index into it: the sync watch
view (``GET /syncs/watch``, merging sites by path, function, op and line, summing counts) and the
``sidecar_sync_watch_calls`` family of ``/metrics``. A report of another shape (a fuzzed frame, a
relay's, a probe of a buggy version) made the first answer 500 and the second drop every family
collected after it. So a report is kept only if it converts to ``WatchReport``; otherwise the
probe's previous report stays and the heartbeat's other fields are taken as usual.
"""

from __future__ import annotations

from typing import Any

import msgspec


class WatchSite(msgspec.Struct):
    """The fields of a site that the readers use (others are kept as sent)."""

    path: str
    line: int
    function: str
    op: str
    count: int
    count_per_step: float
    classification: str
    first_step: int | None = None
    last_step: int | None = None
    file: str | None = None
    phase: str | None = None


class WatchReport(msgspec.Struct):
    sites: list[WatchSite] = []


def watch_report_problem(report: Any) -> str | None:
    """Why ``report`` cannot be kept as a probe's watch report (None: it can)."""
    try:
        msgspec.convert(report, WatchReport)
    except msgspec.ValidationError as exc:
        return str(exc)
    return None
