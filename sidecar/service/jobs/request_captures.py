"""Request-scoped captures on the sidecar's side: a request that asked to be captured gets a capture
bound to it, armed in every engine process before the request's first step (docs/api.md, "Captures
of one request").

The process that received the request (the API server) sends ``request_capture`` over the probe
channel and holds the request until it has the answer. The capture is started through the same
``CaptureManager.start`` as ``/profile/start`` and a trigger's firing (one job at a time: another job
running means the request is served uncaptured, "busy"), bound to the request
(``BoundCaptureRequest``: it begins at once, its steps are a cap). The answer goes back once every
selected step-driven process has answered "armed", or after ``ARMED_WAIT_S`` with the processes that
did not: then the capture is stopped and the request goes on uncaptured. The request's end ends the
capture in the engine processes themselves (the engine integration does it on each step thread);
nothing here waits for it.

Each ask is counted once in ``sidecar_request_captures_total{outcome, reason}`` (sidecar/service/metrics/captures.py).
An ask the engine released before the answer (it stopped waiting, or its client left) stops the
capture and counts as ``released``; a release after an "armed" answer only stops the capture.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass


from ...common.protocol import RequestCapture, RequestCaptureAnswer, RequestCaptureRelease
from ...common.step_window import clip
from ..metrics.captures import CaptureMetrics
from .captures import BoundCaptureRequest, Capture, CaptureManager, capture_url
from .states import FINAL
from .model import JobBusy, NoProbes
from ..channel.registry import ProbeConnection

log = logging.getLogger(__name__)

# How long the sidecar waits for every step-driven process to answer "armed" before it tells the
# request to go on uncaptured: less than the engine's own wait (probe/request_capture.py, 2 s), so
# that the request hears why.
ARMED_WAIT_S = 1.5


@dataclass(eq=False)
class _Ask:
    capture: Capture | None = None  # once started
    released: str | None = None  # the engine's reason, once it stopped waiting


class RequestCaptures:
    def __init__(self, captures: CaptureManager, metrics: CaptureMetrics, *, max_steps: int,
                 armed_wait_s: float = ARMED_WAIT_S) -> None:
        """``max_steps``: the sidecar's ``--max-steps``; a larger cap is lowered to it."""
        self._captures = captures
        self._metrics = metrics
        self._max_steps = max_steps
        self._armed_wait_s = armed_wait_s
        self._asks: dict[tuple[int, int], _Ask] = {}  # (connection id, ask id) -> the ask, while it can be released
        self._tasks: set[asyncio.Task] = set()

    def on_ask(self, conn: ProbeConnection, msg: RequestCapture) -> None:
        """An ask arrived (the probe channel's reader): served on a task of its own, so that the
        asking process's other messages (its own window's reports) are read meanwhile."""
        self._forget_finished()
        ask = self._asks[(conn.id, msg.ask)] = _Ask()
        task = asyncio.get_running_loop().create_task(self._serve(conn, msg, ask))
        self._tasks.add(task)
        task.add_done_callback(self._task_ended)

    async def on_release(self, conn: ProbeConnection, msg: RequestCaptureRelease) -> None:
        ask = self._asks.pop((conn.id, msg.ask), None)
        if ask is None:
            return
        ask.released = msg.reason
        if ask.capture is not None:
            await self._captures.stop_capture(ask.capture, f"released: {msg.reason}")

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- serving one ask ---------------------------------------------------------------------------
    async def _serve(self, conn: ProbeConnection, msg: RequestCapture, ask: _Ask) -> None:
        request = BoundCaptureRequest(steps=min(msg.steps, self._max_steps), request_id=msg.request_id,
                                      asked_by=conn.identity.label)
        try:
            capture = await self._captures.start(request)
        except JobBusy as exc:
            await self._skip(conn, msg, "busy", f"busy: {exc}")
            return
        except NoProbes as exc:
            await self._skip(conn, msg, "no_engine_processes", str(exc))
            return
        except Exception as exc:  # a bad selection, the disk-space floor (507 on /profile/start)
            await self._skip(conn, msg, "refused", f"refused: {exc}")
            return
        ask.capture = capture
        if ask.released is not None:  # released while the capture was being armed
            await self._captures.stop_capture(capture, f"released: {ask.released}")
        try:
            await asyncio.wait_for(capture.armed_event.wait(), self._armed_wait_s)
        except asyncio.TimeoutError:
            pass
        if ask.released is not None:  # the request went on before the answer: nothing to tell it
            self._metrics.observe_request_capture("released")
            return
        # A process that answered "armed" counts even if it has ended since (a cap of one busy step).
        missing = [p for p in capture.step_driven if p.steps_seen is None]
        if missing:
            why = "; ".join(f"{p.label}: {p.error or 'did not answer arm in time'}" for p in missing)
            await self._captures.stop_capture(capture, f"not armed in every process: {why}")
            await self._skip(conn, msg, "not_armed", f"not armed in every process: {why}")
            return
        self._metrics.observe_request_capture(None)
        await conn.send(RequestCaptureAnswer(ask=msg.ask, capture_id=capture.id, url=capture_url(capture.id)))

    async def _skip(self, conn: ProbeConnection, msg: RequestCapture, reason: str, text: str) -> None:
        self._asks.pop((conn.id, msg.ask), None)
        self._metrics.observe_request_capture(reason)
        log.info("request %s served uncaptured: %s", msg.request_id, text)
        await conn.send(RequestCaptureAnswer(ask=msg.ask, skipped=clip(text)))

    def _forget_finished(self) -> None:
        """Asks whose capture has ended cannot be released any more: forgotten (bounded memory)."""
        for key, ask in list(self._asks.items()):
            if ask.capture is not None and ask.capture.state in FINAL:
                del self._asks[key]

    def _task_ended(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("request capture: ask failed", exc_info=task.exception())

