"""The requests in flight as vLLM's engine core knows them, for ``GET /requests`` and the heartbeat.

Read on the probe's link thread while the engine's step thread may be mutating the scheduler: the
dict of requests is copied in one C call (``list(d.values())``), retried if it changed size meanwhile,
and each request's fields are read once. A request is "queued" while waiting (or preempted and
waiting again), "prefill" while running with no output token yet (or part of its prompt not yet
scheduled), "decode" after.
vLLM's ``Request.arrival_time`` is the wall clock of the API server receiving it, so ages are true
across the two processes of one host.
"""

from __future__ import annotations

import time
from typing import Any

from vllm.v1.request import RequestStatus

_TRIES = 5


def _phase(status: RequestStatus, computed: int, prompt: int, output: int) -> str:
    if status == RequestStatus.RUNNING:
        # vLLM counts a step's tokens as computed when it schedules the step, so a prompt whose
        # forward is running has all its tokens "computed" already: no output token yet is prefill.
        return "prefill" if computed < prompt or output == 0 else "decode"
    if status == RequestStatus.PREEMPTED:
        return "preempted"
    return "queued"


def requests_in_flight(core: Any) -> list[dict[str, Any]]:
    """Every request the engine core's scheduler holds that has not finished."""
    requests = getattr(core.scheduler, "requests", {})
    for _ in range(_TRIES):
        try:
            snapshot = list(requests.values())
            break
        except RuntimeError:  # changed size during the copy: the step thread added or removed one
            continue
    else:
        return []
    now = time.time()
    out = []
    for req in snapshot:
        status = req.status
        if RequestStatus.is_finished(status):
            continue
        prompt, computed, output = req.num_prompt_tokens, req.num_computed_tokens, req.num_output_tokens
        out.append({
            "id": req.request_id,
            "arrived_ns": int(req.arrival_time * 1e9),
            "age_s": round(max(0.0, now - req.arrival_time), 3),
            "phase": _phase(status, computed, prompt, output),
            "status": status.name.lower(),
            "prompt_tokens": prompt,
            "computed_tokens": computed,
            "output_tokens": output,
        })
    out.sort(key=lambda r: r["arrived_ns"])
    return out
