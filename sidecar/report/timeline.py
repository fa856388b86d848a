"""A process's capture window as a timeline (SVG): its steps, how busy the GPU was in each, the
largest idle gaps coloured by cause, and the steps that synchronised. Positions come from the
summary: ``steps[].start_at_us`` and ``gaps.largest[].at_us`` are both from the process window's start
(docs/analysis.md), so they share one axis. The summary has no time for each sync, only its step: a
sync mark sits on its step, sized by the host time blocked there.
"""

from __future__ import annotations

import math

from .markup import duration, esc, percent, tag
from .phases_view import phases_lane
from .styles import CAUSE_COLOURS, STEP, STEP_CUT, SYNC

WIDTH = 960
LEFT = 100  # the lane names
PLOT = WIDTH - LEFT - 10
LANE = 26
# A thousand-step capture draws a thousand rectangles per lane: fine. Far more (a long training trace)
# would make a page of megabytes for marks narrower than a pixel; the rest is in the table and the JSON.
MAX_STEPS_DRAWN = 2000


def process_timeline(process: dict, anatomy: dict | None = None) -> str:
    """``anatomy``: the process's entry of the summary's step anatomy (phases_view.entry_for), if any."""
    window = float(process.get("window_us") or 0)
    steps = process.get("steps") or []
    gaps = (process.get("gaps") or {}).get("largest") or []
    if window <= 0:
        return ""
    drawn = steps[:MAX_STEPS_DRAWN]
    x = lambda us: LEFT + PLOT * max(0.0, min(us, window)) / window  # noqa: E731
    w = lambda us: max(PLOT * us / window, 1.0)  # noqa: E731 (a mark stays visible)
    # A lane with nothing to show is left out (a CPU host has no GPU lanes): empty rows read as "all fine".
    lanes = [("steps", _steps_lane(drawn, x, w))]
    if anatomy:
        lanes.append(("phases", phases_lane(drawn, anatomy, x, w)))
    if any(s.get("kernel_count") for s in drawn) or gaps:
        lanes += [("GPU busy", _busy_lane(drawn, x, w)), ("idle gaps", _gaps_lane(gaps, x, w))]
    if any(s.get("sync_count") for s in drawn):
        lanes.append(("syncs", _syncs_lane(drawn, x)))
    out = [_axis(window)]
    for i, (name, marks) in enumerate(lanes):
        y = 22 + i * LANE
        out.append(f'<text x="{LEFT - 8}" y="{y + 16}" text-anchor="end">{esc(name)}</text>')
        out.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT}" y1="{y + LANE - 2}" y2="{y + LANE - 2}" stroke="#e3e6e9"/>')
        out.append(f'<g transform="translate(0 {y})">{marks}</g>')
    height = 22 + len(lanes) * LANE + 4
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
           f'height="{height}" role="img" class="timeline" aria-label="timeline of {esc(process.get("label"))}">'
           + "".join(out) + "</svg>")
    if len(steps) > len(drawn):
        svg += tag("p", f"The first {len(drawn):,} of {len(steps):,} steps are drawn.", class_="note")
    return svg


def _axis(window: float) -> str:
    tick = _nice_tick(window / 8)
    out = []
    t = 0.0
    while t <= window + 1e-9:
        px = LEFT + PLOT * t / window
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="14" y2="18" stroke="#888"/>'
                   f'<text x="{px:.1f}" y="11" text-anchor="middle" class="small">{esc(_short(t))}</text>')
        t += tick
    return "".join(out)


def _nice_tick(raw: float) -> float:
    if raw <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _short(us: float) -> str:
    if us >= 1_000_000:
        return f"{us / 1_000_000:g} s"
    if us >= 1000:
        return f"{us / 1000:g} ms"
    return f"{us:g} µs"


def _steps_lane(steps: list[dict], x, w) -> str:
    out = []
    for s in steps:
        left, width = x(s["start_at_us"]), w(s["wall_us"])
        tip = (f"step {s['step']}: {duration(s['wall_us'])}, GPU busy {percent(s.get('gpu_busy_fraction'))}, "
               f"{s.get('kernel_count', 0):,} kernels, {s.get('sync_count', 0):,} syncs, "
               f"{s.get('gap_count', 0):,} idle gaps ({duration(s.get('gap_us'))})"
               + (" — cut off where recording stopped" if s.get("partial") else ""))
        fill = STEP_CUT if s.get("partial") else STEP
        label = (f'<text x="{left + 3:.1f}" y="15" class="on-bar">{esc(s["step"])}</text>'
                 if width > 8 * (len(str(s["step"])) + 1) else "")
        out.append(tag("g", tag("title", esc(tip))
                       + f'<rect x="{left:.1f}" y="3" width="{width:.1f}" height="18" fill="{fill}" '
                         f'stroke="#fff" stroke-width="0.5"/>' + label, class_="step"))
    return "".join(out)


def _busy_lane(steps: list[dict], x, w) -> str:
    out = []
    for s in steps:
        busy = float(s.get("gpu_busy_fraction") or 0)
        h = 18 * min(busy, 1.0)
        out.append(tag("g", tag("title", esc(f"step {s['step']}: GPU busy {percent(busy)}"))
                       + f'<rect x="{x(s["start_at_us"]):.1f}" y="{21 - h:.1f}" width="{w(s["wall_us"]):.1f}" '
                         f'height="{h:.1f}" fill="#2b7bba" stroke="#fff" stroke-width="0.5"/>'))
    return "".join(out)


def _gaps_lane(gaps: list[dict], x, w) -> str:
    out = []
    for g in gaps:
        where = f" in step {g['step']}" if g.get("step") is not None else ""
        tip = (f"{duration(g['dur_us'])} idle on device {g.get('device')}{where}: {g['cause']}"
               + (f" — {g['detail']}" if g.get("detail") else ""))
        out.append(tag("g", tag("title", esc(tip))
                       + f'<rect x="{x(g["at_us"]):.1f}" y="3" width="{w(g["dur_us"]):.1f}" height="18" '
                         f'fill="{CAUSE_COLOURS.get(g["cause"], "#999")}"/>', class_="gap"))
    return "".join(out)


def _syncs_lane(steps: list[dict], x) -> str:
    synced = [s for s in steps if s.get("sync_count")]
    if not synced:
        return ""
    most = max(float(s.get("sync_us") or 0) for s in synced) or 1.0
    out = []
    for s in synced:
        r = 3 + 6 * math.sqrt(float(s.get("sync_us") or 0) / most)
        cx = x(s["start_at_us"] + s["wall_us"] / 2)
        tip = f"step {s['step']}: {s['sync_count']:,} syncs, {duration(s.get('sync_us'))} blocked"
        out.append(tag("g", tag("title", esc(tip)) + f'<circle cx="{cx:.1f}" cy="12" r="{r:.1f}" fill="{SYNC}" '
                                                    f'fill-opacity="0.75"/>', class_="sync"))
    return "".join(out)
