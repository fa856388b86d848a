"""Charts as inline SVG (no script, no library): horizontal bars and a bar of shares. Every text in
them goes through ``esc``; the full name of a shortened label is the bar's tooltip (``<title>``)."""

from __future__ import annotations

from dataclasses import dataclass

from .markup import esc, tag
from .styles import BAR, BAR_LIGHT, CAUSE_COLOURS

WIDTH = 960
LABEL_W = 360
VALUE_W = 170
ROW_H = 20


@dataclass(frozen=True)
class Bar:
    label: str  # shown, shortened if needed
    value: float  # the bar's length, against the chart's largest value (or ``scale``)
    text: str  # written after the bar: the figure
    tooltip: str = ""  # the whole story on hover (the full kernel name)
    backdrop: float | None = None  # a lighter bar behind it, e.g. the span a busy time is out of


def bar_chart(bars: list[Bar], *, label: str, scale: float | None = None) -> str:
    """One row per bar; ``label``: what the chart shows, for screen readers."""
    if not bars:
        return ""
    top = scale or max(max(b.value, b.backdrop or 0) for b in bars) or 1.0
    area = WIDTH - LABEL_W - VALUE_W
    rows = []
    for i, b in enumerate(bars):
        y = i * ROW_H
        parts = [f'<text x="{LABEL_W - 8}" y="{y + 14}" text-anchor="end">{esc(_clip(b.label, 56))}</text>']
        if b.backdrop:
            parts.append(_rect(LABEL_W, y + 3, area * b.backdrop / top, ROW_H - 6, BAR_LIGHT))
        parts.append(_rect(LABEL_W, y + 3, max(area * b.value / top, 1 if b.value > 0 else 0), ROW_H - 6, BAR))
        parts.append(f'<text x="{LABEL_W + area + 6}" y="{y + 14}">{esc(b.text)}</text>')
        rows.append(tag("g", tag("title", esc(b.tooltip or b.label)) + "".join(parts), class_="bar"))
    height = len(bars) * ROW_H
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
            f'height="{height}" role="img" aria-label="{esc(label)}">{"".join(rows)}</svg>')


def share_bar(parts: list[tuple[str, float, str]], *, label: str, colours: dict[str, str] = CAUSE_COLOURS) -> str:
    """One bar split into shares: ``(key, value, tooltip)``; keys pick the colour (the gap causes)."""
    total = sum(v for _, v, _ in parts)
    if total <= 0:
        return ""
    x, out = 0.0, []
    for key, value, tip in parts:
        w = WIDTH * value / total
        if w <= 0:
            continue
        out.append(tag("g", tag("title", esc(tip)) + _rect(x, 0, w, 18, colours.get(key, "#999")), class_="share"))
        x += w
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} 18" width="{WIDTH}" height="18" '
            f'role="img" aria-label="{esc(label)}">{"".join(out)}</svg>')


def legend(items: list[tuple[str, str]]) -> str:
    """``(css class of the swatch, text)``: the colours are styles.CSS's ``.legend i.c-*``."""
    return tag("div", "".join(tag("span", tag("i", "", class_=cls) + esc(text)) for cls, text in items),
               class_="legend")


def _rect(x: float, y: float, w: float, h: float, fill: str) -> str:
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{fill}"/>'


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
