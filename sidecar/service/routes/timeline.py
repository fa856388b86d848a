"""``GET /recorder/timeline``: the flight recorder's last minutes made small for the home page's chart
(docs/api.md, "Incidents"): per engine process a few hundred buckets of step times, the slow steps
with their rows, GC pauses, the finished requests' TTFT and end-to-end times, the requests in flight,
the stuck steps the watchdogs report, and the captures and trigger firings of the window as marks.

Cheap for the engine by construction: the rows come from the sidecar's store of the window
(sidecar/service/incidents/recorder_window.py), which asks each probe only for what is new since its
last read, and which every open tab shares; the downsampling is the sidecar's
(sidecar/service/incidents/recorder_timeline.py). No engine process connected: an empty timeline.
"""

from __future__ import annotations

import json
import time
from typing import Mapping

from aiohttp import web

from ..incidents import recorder_timeline as timeline_view
from ..incidents.recorder_window import RecorderWindows
from ..jobs.params import ParamError
from .keys import CAPTURES, QUERIES, REGISTRY, TRIGGERS

TIMELINE_PATH = "/recorder/timeline"
TIMELINE = web.AppKey("recorder_timeline", RecorderWindows)
MIN_SECONDS, MAX_SECONDS = 10.0, 3600.0
MAX_SLOW_MS = 3_600_000.0
KNOWN = ("seconds", "points", "slow_ms", "gc_ms")


def _number(params: Mapping[str, str], name: str, default: float | None, lo: float, hi: float) -> float | None:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not lo <= value <= hi:  # NaN fails both
        raise ParamError(name, f"must be a number from {lo:g} to {hi:g}, got {raw!r}")
    return value


def parse_timeline_query(params: Mapping[str, str]) -> tuple[float, int, float | None, float]:
    """(seconds, points, slow_ms or None, gc_ms) of ``GET /recorder/timeline``; ParamError (400) naming the bad one."""
    unknown = sorted(set(params) - set(KNOWN))
    if unknown:
        raise ParamError(unknown[0], f"unknown parameter; known: {', '.join(KNOWN)}")
    seconds = _number(params, "seconds", timeline_view.DEFAULT_SECONDS, MIN_SECONDS, MAX_SECONDS)
    points = _number(params, "points", timeline_view.DEFAULT_POINTS, timeline_view.MIN_POINTS,
                     timeline_view.MAX_POINTS)
    if points != int(points):
        raise ParamError("points", f"must be a whole number, got {params['points']!r}")
    slow_ms = _number(params, "slow_ms", None, 0.001, MAX_SLOW_MS)
    gc_ms = _number(params, "gc_ms", timeline_view.DEFAULT_GC_MS, 0.0, MAX_SLOW_MS)
    return seconds, int(points), slow_ms, gc_ms


async def recorder_timeline(request: web.Request) -> web.Response:
    seconds, points, slow_ms, gc_ms = parse_timeline_query(request.query)
    app = request.app
    conns = app[REGISTRY].all()
    if conns:
        snapshot = await app[TIMELINE].read(app[QUERIES], conns, seconds)
        rows, until_ns = snapshot.processes, snapshot.read_ns
    else:
        rows, until_ns = [], time.time_ns()
    stuck = [{**c.stuck, "process": c.identity.label} for c in conns if c.stuck]
    firings = [f for t in app[TRIGGERS].all() for f in t.firings]
    body = timeline_view.build(rows, since_ns=until_ns - int(seconds * 1e9), until_ns=until_ns, points=points,
                               read_ns=until_ns, slow_ms=slow_ms, gc_ms=gc_ms, stuck=stuck,
                               captures=[c.to_json() for c in app[CAPTURES].recent()], firings=firings)
    return web.Response(text=json.dumps(body, separators=(",", ":")), content_type="application/json",
                        headers={"Cache-Control": "no-store"})


async def _close(app: web.Application) -> None:
    app[TIMELINE].close()


def add_timeline_routes(app: web.Application) -> None:
    app[TIMELINE] = RecorderWindows()
    app.on_cleanup.append(_close)
    app.add_routes([web.get(TIMELINE_PATH, recorder_timeline)])
