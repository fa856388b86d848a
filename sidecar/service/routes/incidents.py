"""``/recorder``, ``/stacks`` and ``/requests``: what an on-call engineer asks of a sick engine (docs/api.md,
docs/incidents.md).

Each asks every selected engine process at once over the probe channel (sidecar/service/channel/queries.py) and merges the
answers; a process that does not answer in time is listed with the reason, and the others are still
shown, so a stuck process never makes these hang. The probes answer from their own threads, which is
what lets ``/stacks`` show a step thread blocked inside a forward that never returns.

``/stacks`` (either mode) and ``/recorder`` each hold the slot of every process they ask
(sidecar/service/channel/query_slots.py): while one is in flight to a process, another that selects it is a 429 with
``Retry-After``, and the engine never runs two samplers. A probe's own refusal (it still runs an
earlier query, one this sidecar stopped waiting for) is a 429 too when no process answered otherwise.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import time
from typing import Any

from aiohttp import web

from ...common import config
from ..incidents import recorder_view
from ...stacks import view as stacks_view
from .keys import QUERIES, REGISTRY
from ...stacks.native import native_stacks
from ..jobs.params import ParamError, RecorderRequest, StacksRequest, parse_recorder_request, parse_stacks_request
from ..channel.queries import Reply
from ..channel.query_slots import BUSY_ERROR, ProbesBusy, Work, probe_busy_retry_s
from ..incidents.recorder_dump import gather_recording
from .responses import json_error
from .timeline import add_timeline_routes

log = logging.getLogger(__name__)

# How long the processes have to answer, on top of a sampling's own seconds: a snapshot of every
# thread is asked to arrive within 2 s (issue 11).
SNAPSHOT_TIMEOUT_S = 2.0
REQUESTS_TIMEOUT_S = 2.0


def _selected(request: web.Request, job_request: Any) -> list:
    connected = request.app[REGISTRY].all()
    if not connected:
        raise _no_processes()
    conns = [c for c in connected if job_request.selects(c.identity.role, c.identity.rank)]
    if not conns:  # the engine is there: the selection is what is wrong
        raise ParamError("processes", "selects none of the connected processes: " +
                         ", ".join(c.identity.label for c in connected))
    return conns


def _no_processes() -> web.HTTPException:
    body = json.dumps({"error": "no_engine_processes",
                       "message": f"no engine process is connected: is the plugin installed "
                                  f"and {config.ENV_ENDPOINT} right?"})
    return web.HTTPServiceUnavailable(text=body, content_type="application/json")


def _busy(exc: ProbesBusy) -> web.Response:
    return json_error(429, BUSY_ERROR, str(exc), headers={"Retry-After": str(exc.retry_after_s)},
                      retry_after_s=exc.retry_after_s, processes=exc.processes)


def _refused_by_probes(failed: list[tuple[str, str | None]]) -> web.Response | None:
    """A 429 when every process (label, error) refused as busy (sidecar/probe/queries.py); else None."""
    retry = [probe_busy_retry_s(error) for _, error in failed]
    if not failed or None in retry:
        return None
    return json_error(429, BUSY_ERROR, "the processes still run an earlier query: " +
                      "; ".join(f"{label}: {error}" for label, error in failed),
                      headers={"Retry-After": str(max(retry))}, retry_after_s=max(retry),
                      processes=[{"process": label, "error": error} for label, error in failed])


def _answers(replies: list[Reply], data) -> list[tuple[dict, dict | None, str | None]]:
    return [(r.conn.to_json(), data(r) if r.answer is not None and r.error is None else None, r.error) for r in replies]


# -- /recorder -----------------------------------------------------------------------------------------
async def recorder(request: web.Request) -> web.StreamResponse:
    req: RecorderRequest = parse_recorder_request(request.query, request.app[REGISTRY].roles())
    conns = _selected(request, req)
    try:
        answers, since_ns, until_ns = await gather_recording(request.app[QUERIES], conns, req.seconds, slot_wait_s=0,
                                                              window_ns=req.window_ns)
    except ProbesBusy as exc:
        return _busy(exc)
    refused = _refused_by_probes([(process["label"], error) for process, _, error in answers])
    if refused is not None:
        return refused
    loop = asyncio.get_running_loop()
    # Merging, converting and encoding a long recording takes seconds (nine full rings: about 10 s):
    # off the event loop, which serves the probes' heartbeats and the other requests meanwhile.
    data, gzipped = await loop.run_in_executor(None, _encoded_recording, answers, since_ns, until_ns, req.format,
                                               "gzip" in request.headers.get("Accept-Encoding", ""))
    return web.Response(body=data, content_type="application/json",
                        headers={"Content-Encoding": "gzip"} if gzipped else None)


def _encoded_recording(answers: list, since_ns: int, until_ns: int, fmt: str, gzip_ok: bool) -> tuple[bytes, bool]:
    merged = recorder_view.merge(answers, since_ns, until_ns)
    body = recorder_view.to_chrome_trace(merged) if fmt == "trace" else merged
    data = json.dumps(body, separators=(",", ":")).encode()
    if gzip_ok and len(data) > 64 << 10:  # a 10-minute recording is several MiB
        return gzip.compress(data, 5), True
    return data, False


# -- /stacks -------------------------------------------------------------------------------------------
async def stacks(request: web.Request) -> web.StreamResponse:
    req: StacksRequest = parse_stacks_request(request.query, request.app[REGISTRY].roles())
    conns = _selected(request, req)
    if req.mode == "native":
        return await _native(request, req, conns)
    query = {"kind": "stacks", "seconds": req.seconds, "hz": req.hz, "only_step_thread": req.threads == "step"}
    work = Work(f"a stacks sampling of {req.seconds:g} s", req.seconds) if req.seconds else Work("a stacks snapshot")
    try:
        with request.app[QUERIES].slots.hold(conns, work):
            replies = await request.app[QUERIES].ask(conns, query, req.seconds + SNAPSHOT_TIMEOUT_S)
    except ProbesBusy as exc:
        return _busy(exc)
    answers = _answers(replies, lambda r: r.answer.data)
    failed = [{"process": p["label"], "error": e} for p, d, e in answers if d is None]
    if len(failed) == len(answers):
        refused = _refused_by_probes([(f["process"], f["error"]) for f in failed])
        if refused is not None:
            return refused
        return json_error(502, "no_stacks", "no engine process gave its stacks: " +
                          "; ".join(f"{f['process']}: {f['error']}" for f in failed), processes=failed)
    if req.seconds > 0:
        if req.format == "speedscope":  # the processes that gave nothing are named beside the profiles
            return web.json_response({**stacks_view.to_speedscope(answers), "failed_processes": failed})
        if req.format == "text":
            notes = "".join(f"# {f['process']}: {f['error']}\n" for f in failed)
            return web.Response(text=notes + stacks_view.samples_to_folded(answers))
        return web.json_response({"seconds": req.seconds, "hz": req.hz, "processes": [
            {"process": p, "error": e, "samples": d} for p, d, e in answers]})
    merged = stacks_view.merge_snapshots(answers)
    if req.format == "text":
        return web.Response(text=stacks_view.to_text(merged))
    return web.json_response(merged)


async def _native(request: web.Request, req: StacksRequest, conns: list) -> web.Response:
    if req.seconds > 0 or req.format == "speedscope":
        return json_error(400, "bad_parameter", "mode=native takes one snapshot: no seconds, format json or text",
                          param="mode")
    try:  # py-spy stops each process while it reads it: one at a time, like the probes' own queries
        with request.app[QUERIES].slots.hold(conns, Work("a native stacks dump (py-spy)")):
            result = await native_stacks([c.to_json() for c in conns])
    except ProbesBusy as exc:
        return _busy(exc)
    if result.unavailable:
        return json_error(501, "native_stacks_unavailable", result.unavailable)
    if req.format == "text":
        return web.Response(text=result.text)
    return web.json_response(result.merged)


# -- /requests -----------------------------------------------------------------------------------------
async def requests_in_flight(request: web.Request) -> web.Response:
    if request.query:  # every process is asked: the engine core is the one that knows the requests
        unknown = sorted(request.query)[0]
        return json_error(400, "bad_parameter", f"{unknown}: unknown parameter; /requests takes none", param=unknown)
    conns = request.app[REGISTRY].all()
    if not conns:
        raise _no_processes()
    replies = await request.app[QUERIES].ask(conns, {"kind": "requests"}, REQUESTS_TIMEOUT_S)
    now_ns = time.time_ns()
    rows: dict[str, dict] = {}
    processes = []
    for reply in replies:
        data = reply.answer.data if reply.answer is not None and reply.error is None else None
        known = bool(data and data.get("known"))
        processes.append({"process": reply.conn.to_json()["label"], "knows_requests": known, "error": reply.error})
        for row in (data or {}).get("requests", []) if known else []:
            row = {**row, "process": reply.conn.identity.label}
            if row.get("arrived_ns"):
                row["age_s"] = round(max(0, now_ns - row["arrived_ns"]) / 1e9, 3)
            rows.setdefault(str(row.get("id")), row)  # data-parallel engines: each request is in one
    listed = sorted(rows.values(), key=lambda r: -(r.get("age_s") or 0))
    return web.json_response({
        "count": len(listed),
        "oldest_age_s": listed[0].get("age_s") if listed else None,
        "by_phase": {p: sum(1 for r in listed if r.get("phase") == p) for p in ("queued", "prefill", "decode", "preempted")},
        "requests": listed,
        "processes": processes,
    })


def add_incident_routes(app: web.Application) -> None:
    app.add_routes([
        web.get("/recorder", recorder),
        web.get("/stacks", stacks),
        web.get("/requests", requests_in_flight),
    ])
    add_timeline_routes(app)  # GET /recorder/timeline: the home page's chart
