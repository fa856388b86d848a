"""Pages a person looks at: the capture report and the sidecar's home page, as HTML.

``render_capture_report(summary)``: one self-contained HTML file from the analyser's summary (inline
SVG charts, no network); ``write_html_report`` is ``sidecar analyze --html``. ``render_home`` draws the
home page from the service's state (sidecar/service/page_routes.py serves both). Every text from a
trace or an engine is escaped (markup.py) and every page carries a Content-Security-Policy that
allows its own script and style only (document.py).
"""

from .capture_report import Link, render_capture_report
from .files import write_html_report

__all__ = ["Link", "render_capture_report", "write_html_report"]
