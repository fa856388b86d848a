"""The requests in flight as SGLang's scheduler knows them, for ``GET /requests`` and the heartbeat's
in-flight count (``sidecar_requests_in_flight``).

The scheduler is the process that knows each request's phase, as vLLM's engine core does: a request
is "queued" in its ``waiting_queue`` ("preempted" when SGLang retracted it there from decoding),
"prefill" in a batch with no output token yet (a chunked prefill included), "decode" after. A request
being prefilled is in the batch the scheduler is running, not yet in ``running_batch``: the batches
read are ``running_batch``, ``last_batch``, the batch planned this iteration (``cur_batch_for_debug``)
and the chunked request. The HTTP server's own bookkeeping (``sidecar.instrument``'s request calls)
cannot tell a queued request from one in prefill, so the HTTP server reports none (hooks.py).

Read on the probe's link thread while the scheduler's thread may be changing them: each list is
copied in one C call (``list(...)``), retried if it changed size meanwhile, and each request's fields
are read once; a request in two places is listed once. Times are SGLang's ``time.perf_counter()``
(the host's monotonic clock on Linux, one clock for all of its processes): the arrival is the HTTP
server's (``created_time``) where the scheduler was given it, else the scheduler's receipt; made
wall-clock by the offset between the two clocks now.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

_TRIES = 5


def _copy(items: Any) -> list:
    if not items:
        return []
    for _ in range(_TRIES):
        try:
            return list(items)
        except RuntimeError:  # changed size during the copy
            continue
    return []


def _batch_reqs(batch: Any) -> list:
    return _copy(getattr(batch, "reqs", None)) if batch is not None else []


def _arrival(req: Any) -> float:
    stats = getattr(req, "time_stats", None)
    return (getattr(stats, "created_time", 0.0) or getattr(stats, "scheduler_recv_time", 0.0) or 0.0) if stats else 0.0


def _row(req: Any, queued: bool, now_wall: float, now_mono: float) -> dict[str, Any]:
    output = len(req.output_ids)
    if queued:
        phase = "preempted" if getattr(req, "retraction_count", 0) else "queued"
    else:
        phase = "decode" if output else "prefill"
    arrived = _arrival(req)
    arrived_wall = now_wall - (now_mono - arrived) if arrived else now_wall
    return {
        "id": str(req.rid),
        "arrived_ns": int(arrived_wall * 1e9),
        "age_s": round(max(0.0, now_wall - arrived_wall), 3),
        "phase": phase,
        "prompt_tokens": len(req.origin_input_ids),
        "output_tokens": output,
    }


def requests_in_flight(scheduler: Any) -> list[dict[str, Any]]:
    """Every request SGLang's ``scheduler`` holds that has not finished, oldest first."""
    waiting = _copy(scheduler.waiting_queue)
    running: list = []
    for batch in (scheduler.running_batch, scheduler.last_batch, getattr(scheduler, "cur_batch_for_debug", None)):
        running += _batch_reqs(batch)
    chunked = scheduler.chunked_req
    if chunked is not None:
        running.append(chunked)
    now_wall, now_mono = time.time(), time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    # The waiting queue first: a request SGLang retracted is waiting again while the last batch that
    # decoded it may still list it.
    places: Iterable[tuple[list, bool]] = ((waiting, True), (running, False))
    for reqs, queued in places:
        for req in reqs:
            if req.finished() or str(req.rid) in rows:
                continue
            rows[str(req.rid)] = _row(req, queued, now_wall, now_mono)
    return sorted(rows.values(), key=lambda r: r["arrived_ns"])
