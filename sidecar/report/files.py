"""``sidecar analyze PATH --html OUT``: the report as a file beside (or far from) the trace it explains.

The page links the trace files it was made from by a path relative to the report's own folder, so
that a folder of trace and report moved together (copied off a host, attached to a ticket) keeps its
links; a browser opens such a link from a file:// page without any server.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.request import pathname2url

from .capture_report import Link, render_capture_report
from .markup import size


def trace_links(summary: dict, report_dir: Path) -> list[Link]:
    links = []
    for f in summary["source"]["files"]:
        target = Path(f["path"]).resolve()
        try:
            rel = os.path.relpath(target, report_dir.resolve())
        except ValueError:  # another drive (Windows): no relative path exists
            rel = str(target)
        links.append(Link(f"{target.name} ({size(f['bytes'])}, {f['events']:,} events)", pathname2url(rel),
                          target.name))
    return links


def write_html_report(summary: dict, out: str | os.PathLike) -> Path:
    """Write the page for ``summary`` to ``out`` (its folder made if missing); returns its path. OSError
    when it cannot be written."""
    path = Path(out)
    text = render_capture_report(summary, downloads=trace_links(summary, path.parent))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
