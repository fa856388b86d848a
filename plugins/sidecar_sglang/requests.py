"""SGLang's requests as the sidecar's request telemetry: spans, the GenAI metrics, flight-recorder rows.

The HTTP server's ``TokenizerManager`` already keeps what the telemetry needs, on SGLang's own clocks:
each request's ``ReqState.time_stats`` (created, first token, finished: ``time.perf_counter()``, which
on Linux is the host's monotonic clock) and, in every batch of outputs, the prompt, completion and
cached token counts and the finish reason. ``TokenizerManager._handle_batch_output`` is wrapped: the
states of the batch's requests are looked up before it runs (it deletes a finished one), and each
request that finished in it becomes one ``FinishedRequest`` for ``Instrumentation.record_finished``.
Where the scheduler sends its own time stats (with ``--enable-metrics``), the queue time is its
waiting-queue entry to its first forward; without them the request has no queue span.

Nothing runs per token: a batch costs one dict lookup per request in it, and a finished request one
``FinishedRequest``; the spans and histograms are recorded by the telemetry (the export is off this
path). Requests SGLang ends elsewhere (an abort before any output) are not recorded here.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sidecar.telemetry.requests import FinishedRequest

log = logging.getLogger(__name__)

INSTRUMENT_ATTR = "_inference_sidecar_instrument"  # the HTTP server's sidecar.instrument(...)
_WARNED_ATTR = "_inference_sidecar_requests_warned"
OPERATION = "text_completion"  # SGLang's requests reach the scheduler as generate requests


def _item(values: Any, i: int, default: Any = 0) -> Any:
    try:
        return values[i] if values is not None else default
    except (IndexError, TypeError):
        return default


def _finish_reason(reason: Any) -> str:
    """SGLang's ``{"type": "stop" | "length" | "abort", ...}`` as the telemetry's lower-case word."""
    kind = reason.get("type") if isinstance(reason, dict) else reason
    return str(kind or "stop").lower()


def finished_request(state: Any, batch: Any, i: int, model: str, now_wall: float, now_mono: float) -> FinishedRequest:
    """Request ``i`` of ``batch`` (a ``BatchStrOutput``), finished, as the telemetry takes it."""
    stats = state.time_stats
    created, first, finished = stats.created_time, stats.first_token_time, stats.finished_time or now_mono
    scheduler = _item(getattr(batch, "time_stats", None), i, None)
    queued = getattr(scheduler, "wait_queue_entry_time", 0.0) or 0.0
    scheduled = getattr(scheduler, "forward_entry_time", 0.0) or 0.0
    sampling = getattr(state.obj, "sampling_params", None) or {}
    max_tokens = sampling.get("max_new_tokens") if isinstance(sampling, dict) else None
    return FinishedRequest(
        request_id=str(batch.rids[i]), model=model, operation=OPERATION,
        finish_reason=_finish_reason(_item(batch.finished_reasons, i, None)),
        arrival_time=now_wall - (now_mono - created), finished_time=now_wall - (now_mono - finished),
        queued_ts=queued or created, scheduled_ts=scheduled if queued else 0.0,
        first_token_ts=first, last_token_ts=finished if first else 0.0,
        time_to_first_token=first - created if first else 0.0,
        input_tokens=int(_item(getattr(batch, "prompt_tokens", None), i)),
        output_tokens=int(_item(getattr(batch, "completion_tokens", None), i)),
        cached_input_tokens=int(_item(getattr(batch, "cached_tokens", None), i)),
        max_tokens=int(max_tokens) if isinstance(max_tokens, int) else None,
    )


def _warn_once(manager: Any, exc: BaseException) -> None:
    state = manager.__dict__
    if not state.get(_WARNED_ATTR):
        state[_WARNED_ATTR] = True
        log.warning("inference-sidecar: an SGLang request was not recorded (%s: %s); logged once",
                    type(exc).__name__, exc)


def wrap_handle_batch_output(original):
    async def _handle_batch_output(self, recv_obj, *args, **kwargs):
        inst = self.__dict__.get(INSTRUMENT_ATTR)
        if inst is None:
            return await original(self, recv_obj, *args, **kwargs)
        try:  # before SGLang deletes the states of the requests this batch finishes
            states = self.rid_to_state
            batch = [(i, states.get(rid)) for i, rid in enumerate(recv_obj.rids)]
        except Exception as exc:
            log.debug("inference-sidecar: SGLang batch not read: %s", exc)
            batch = []
        result = await original(self, recv_obj, *args, **kwargs)
        finished = [(i, s) for i, s in batch if s is not None and s.finished]
        if finished:
            model = str(getattr(self, "served_model_name", "") or "unknown")
            now_wall, now_mono = time.time(), time.perf_counter()
            for i, state in finished:
                try:
                    inst.record_finished(finished_request(state, recv_obj, i, model, now_wall, now_mono))
                except Exception as exc:  # another SGLang's fields: this request goes unrecorded, serving goes on
                    _warn_once(self, exc)
        return result

    return _handle_batch_output
