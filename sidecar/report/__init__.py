"""The analysis as HTML pages, from plain dicts (no aiohttp): the capture report.

``render_capture_report(summary)``: one self-contained HTML file from the analyser's summary (inline
SVG charts, no network); ``write_html_report`` is ``sidecar analyze --html``. The sidecar's home page
is sidecar/service/pages; sidecar/service/routes/pages.py serves both. Every text from a trace or an
engine is escaped (markup) and every page carries a Content-Security-Policy that allows its own
script and style only (document).

    capture_report  ``render_capture_report``: a summary as one self-contained page
    files           ``sidecar analyze --html``: the report as a file beside (or far from) its trace
    findings        the figures in words, most telling first
    timeline        a process's capture window as an SVG timeline: steps, GPU busy, gaps, syncs
    phases_view     a step's phases: a lane of the timeline, and each process's mean per phase
    charts          inline SVG charts: horizontal bars and a bar of shares
    memory_page     a memory snapshot's summary as a page
    markup          the one way the pages write HTML: every text through ``esc``
    document        the HTML document every page is: inline style and script, allowed by hash in its CSP
    styles          the pages' one style sheet
    script          the pages' one script
"""

from .capture_report import Link, render_capture_report
from .files import write_html_report

__all__ = ["Link", "render_capture_report", "write_html_report"]
