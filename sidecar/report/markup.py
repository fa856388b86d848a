"""The one way the pages write HTML: every piece of text passes through ``esc`` (kernel names, labels,
paths, reasons: anything from a trace or an engine can hold ``<script>``), and figures are written as
the text report writes them, so that a page and ``sidecar analyze`` say the same number.
"""

from __future__ import annotations

import html
import time
from typing import Iterable

from ..analysis.text import _t as _duration  # the text report's own way of writing a duration


def esc(value: object) -> str:
    """Text for an element's content or a quoted attribute: ``& < > " '`` escaped."""
    return html.escape("" if value is None else str(value), quote=True)


def tag(name: str, content: str = "", /, **attrs: object) -> str:
    """``<name attrs>content</name>``; ``content`` is markup already (escape text with ``esc``).
    Attribute names: ``class_`` is ``class``, ``data_x`` is ``data-x``; None and False leave one out."""
    return f"<{name}{attributes(attrs)}>{content}</{name}>"


def attributes(attrs: dict[str, object]) -> str:
    out = []
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        name = key.rstrip("_").replace("_", "-")
        out.append(f" {name}" if value is True else f' {name}="{esc(value)}"')
    return "".join(out)


def table(headers: Iterable[str], rows: Iterable[Iterable[str]], *, numeric: Iterable[int] = (), **attrs) -> str:
    """A table of markup cells (escape text cells with ``esc``); the columns in ``numeric`` align right."""
    right = set(numeric)
    head = "".join(tag("th", esc(h), class_="num" if i in right else None) for i, h in enumerate(headers))
    body = "".join(
        "<tr>" + "".join(tag("td", cell, class_="num" if i in right else None) for i, cell in enumerate(row)) + "</tr>"
        for row in rows)
    return tag("table", f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody>", **attrs)


def duration(value_us: float | None) -> str:
    return "–" if value_us is None else _duration(value_us)


def percent(fraction: float | None) -> str:
    """As the text report writes a share: one decimal."""
    return "–" if fraction is None else f"{fraction * 100:.1f}%"


def count(value: int | None) -> str:
    return "–" if value is None else f"{value:,}"


def size(n_bytes: int | None) -> str:
    """A file's size as a person reads it: a small capture's trace is kilobytes, not "0.0 MB"."""
    if n_bytes is None:
        return "–"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes} bytes"


def when(unix_s: float | None) -> str:
    """A wall-clock time in UTC: the same on every viewer's screen and in the ids (jobs.py)."""
    if not unix_s:
        return "–"
    return tag("time", esc(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))),
               datetime=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s)))
