"""A memory snapshot's page (``GET /memory/{id}/page``): the job's JSON as one self-contained page.

For each process: its peak (allocated and reserved) and what was live at it by allocation site, its
fragmentation at the end, allocated and reserved over the recorded steps as an inline SVG line chart,
and one row per step. Every text (a site is a file name and a function from the engine's stacks) goes
through ``esc``; the page has no script (its CSP allows none).
"""

from __future__ import annotations

from typing import Any

from .document import page
from .markup import count, esc, size, table, tag, when
from .styles import BAR, BAR_LIGHT

CHART_W, CHART_H, PAD = 960, 180, 4


def _line(points: list[tuple[float, float]], x_max: float, y_max: float, colour: str) -> str:
    coords = " ".join(f"{PAD + (CHART_W - 2 * PAD) * x / x_max:.1f},{CHART_H - PAD - (CHART_H - 2 * PAD) * y / y_max:.1f}"
                      for x, y in points)
    return f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{coords}"/>'


def series_chart(series: list[list[float]]) -> str:
    """Allocated (dark) and reserved (light) bytes against ms since recording began."""
    rows = [r for r in series if isinstance(r, list) and len(r) == 3]
    if len(rows) < 2:
        return ""
    x_max = max(r[0] for r in rows) or 1.0
    y_max = max(max(r[1], r[2]) for r in rows) or 1.0
    lines = (_line([(r[0], r[2]) for r in rows], x_max, y_max, BAR_LIGHT)
             + _line([(r[0], r[1]) for r in rows], x_max, y_max, BAR))
    label = f"allocated and reserved memory over {x_max:g} ms, up to {size(int(y_max))}"
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {CHART_W} {CHART_H}" width="{CHART_W}" '
            f'height="{CHART_H}" role="img" aria-label="{esc(label)}">{lines}</svg>'
            + tag("p", esc(f"dark: allocated, light: reserved; {x_max:g} ms, top {size(int(y_max))}"), class_="note"))


def _process(p: dict[str, Any]) -> str:
    s = p.get("summary") or {}
    head = tag("h2", esc(p.get("label", "")))
    if not s:
        return tag("section", head + tag("p", esc(f"{p.get('state')}: {p.get('error') or 'no summary'}")))
    peak, frag, end = s.get("peak") or {}, s.get("fragmentation") or {}, s.get("end") or {}
    facts = table(["", "allocated", "reserved"], [
        [esc("at the start"), esc(size((s.get("start") or {}).get("allocated_bytes"))),
         esc(size((s.get("start") or {}).get("reserved_bytes")))],
        [esc(f"peak, {peak.get('at_ms', 0):g} ms in"), esc(size(peak.get("allocated_bytes"))),
         esc(size(peak.get("reserved_bytes")))],
        [esc("at the end"), esc(size(end.get("allocated_bytes"))), esc(size(end.get("reserved_bytes")))],
    ], numeric=(1, 2))
    words = (f"{count(s.get('allocations'))} allocations, {count(s.get('frees'))} frees, "
             f"{count(s.get('segment_allocs'))} segments allocated, {count(s.get('entries'))} history entries"
             + (" (the history's limit was reached: its beginning is lost)" if s.get("truncated") else "")
             + f". Fragmentation at the end: {size(frag.get('bytes'))} reserved but not allocated, the largest "
               f"free block {size(frag.get('largest_free_block_bytes'))} of {count(frag.get('free_blocks'))}.")
    sites = table(["allocation site (first frame outside torch)", "bytes", "blocks"],
                  [[tag("code", esc(r.get("site"))), esc(size(r.get("bytes"))), esc(count(r.get("blocks")))]
                   for r in peak.get("sites") or []], numeric=(1, 2))
    steps = table(["step", "allocations", "frees", "highest allocated", "allocated at its end", "reserved at its end"],
                  [[esc(r.get("step")), esc(count(r.get("allocations"))), esc(count(r.get("frees"))),
                    esc(size(r.get("peak_allocated_bytes"))), esc(size(r.get("allocated_bytes"))),
                    esc(size(r.get("reserved_bytes")))] for r in s.get("steps") or []], numeric=(1, 2, 3, 4, 5))
    download = p.get("download")
    raw = (tag("p", tag("a", "Download the raw snapshot", href=download)
                + esc(" (open it in PyTorch's memory viewer, https://pytorch.org/memory_viz)"))
           if download else tag("p", esc(((s.get("raw_file") or {}).get("note")) or "no raw snapshot kept")))
    return tag("section", head + facts + tag("p", esc(words)) + series_chart(s.get("series") or [])
               + tag("h3", "Live at the peak, by allocation site") + sites
               + tag("h3", "Per step") + steps + raw)


def render_memory_page(job: dict[str, Any]) -> str:
    """The page of ``job``, a memory snapshot's JSON (``MemoryJob.to_json``)."""
    subtitle = (f"{job.get('state')}, {job.get('steps')} steps, history of at most {count(job.get('max_entries'))} "
                f"entries, started {when(job.get('created_at'))}" + (f": {job.get('reason')}" if job.get("reason") else ""))
    notes = "".join(tag("li", esc(n)) for n in job.get("notes") or [])
    body = (tag("section", tag("ul", notes)) if notes else "") + "".join(_process(p) for p in job.get("processes") or [])
    return page(f"Memory snapshot {job.get('id')}", body or tag("p", "no process"), subtitle=subtitle, interactive=False)
