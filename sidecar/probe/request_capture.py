"""A request-scoped capture, asked for by the process that receives requests (the API server).

``RequestCaptureAsks.ask(request_id)`` runs on that process's event loop, in the request's own task,
before the request reaches the engine: it sends ``request_capture`` over the probe's link and waits
(asynchronously: the loop serves every other request meanwhile) for the sidecar's answer, which
comes once the capture is armed in every step-driven process. The request then goes on, and its
first step is recorded (sidecar/common/protocol.py: a bound capture begins at arm).

The engine never waits long and never fails because of this: without a connected sidecar the answer
is "skipped" at once; with no answer within ``wait_s`` the request goes on uncaptured and the ask is
released (the sidecar stops the capture it may have started); a task cancelled while it waits (the
client left) releases it too. Every outcome is a ``CaptureOutcome``, which request telemetry puts on
the request's span. Answers arrive on the link thread and are handed to the waiting task's loop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..common import config
from ..common.protocol import MAX_REQUEST_ID, RequestCapture, RequestCaptureAnswer, RequestCaptureRelease

log = logging.getLogger(__name__)

# The most working steps a request-scoped capture records in each process (its prefill first); 0: off.
ENV_REQUEST_CAPTURE_STEPS = "SIDECAR_REQUEST_CAPTURE_STEPS"
DEFAULT_REQUEST_CAPTURE_STEPS = 32
# How long a request waits for its capture to be armed in every process before it goes on without.
# The sidecar answers "not armed" sooner (service/request_captures.py), so this bounds only a sidecar
# that does not answer at all.
WAIT_S = 2.0


def steps_from_environment(env: Mapping[str, str] | None = None) -> int:
    """``SIDECAR_REQUEST_CAPTURE_STEPS``: unset, the default; ``0``, request-scoped captures off (any
    client that reaches the server can ask for one: an operator may not want that); a bad value, the
    default with an error logged naming the variable."""
    source = os.environ if env is None else env
    text = (source.get(ENV_REQUEST_CAPTURE_STEPS) or "").strip()
    if text and text.isascii() and text.isdigit() and int(text) == 0:
        return 0
    return int(config.env_number(ENV_REQUEST_CAPTURE_STEPS, DEFAULT_REQUEST_CAPTURE_STEPS, integer=True, env=source))


@dataclass(eq=False)
class CaptureOutcome:
    """What became of one request's ask: a capture (``capture_id``, ``url``), or why none (``skipped``)."""

    capture_id: str | None = None
    url: str | None = None  # the capture on the sidecar's HTTP API: <SIDECAR_ENDPOINT>/profile/<id>
    skipped: str | None = None
    # The request span's ids once request telemetry has chosen them (the capture span links to it).
    span_context: Any = None


class RequestCaptureAsks:
    def __init__(self, send: Callable[[Any], None], connected: threading.Event, base_url: str,
                 wait_s: float = WAIT_S) -> None:
        """``send``: the probe link's (any thread); ``connected``: set while the sidecar is connected
        and has proven itself; ``base_url``: the sidecar's HTTP address, for the capture's URL."""
        self._send = send
        self._connected = connected
        self._base_url = base_url.rstrip("/")
        self._wait_s = wait_s
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}  # ask id -> the waiting task's future
        self._lock = threading.Lock()  # the event loop adds and removes, the link thread resolves

    async def ask(self, request_id: str, steps: int) -> CaptureOutcome:
        """Ask for a capture of ``request_id``'s steps (at most ``steps``) and wait for it to be armed,
        at most ``wait_s``. Never raises but ``CancelledError`` (the ask is released first)."""
        if not self._connected.is_set():
            return CaptureOutcome(skipped="the sidecar is not connected")
        ask_id = next(self._ids)
        answer: asyncio.Future = asyncio.get_running_loop().create_future()
        with self._lock:
            self._pending[ask_id] = answer
        try:
            self._send(RequestCapture(ask=ask_id, request_id=request_id[:MAX_REQUEST_ID], steps=steps))
            got: RequestCaptureAnswer = await asyncio.wait_for(answer, self._wait_s)
        except asyncio.TimeoutError:
            self._send(RequestCaptureRelease(ask=ask_id, reason=f"the request went on after {self._wait_s:g} s "
                                             "without an answer"))
            return CaptureOutcome(skipped=f"no answer from the sidecar within {self._wait_s:g} s")
        except asyncio.CancelledError:
            self._send(RequestCaptureRelease(ask=ask_id, reason="the request was cancelled while it waited"))
            raise
        except Exception as exc:  # the request must go on whatever happened here
            log.debug("inference-sidecar: request capture ask failed", exc_info=True)
            return CaptureOutcome(skipped=f"the ask failed: {exc}")
        finally:
            with self._lock:
                self._pending.pop(ask_id, None)
        if got.capture_id is None:
            return CaptureOutcome(skipped=got.skipped or "no capture")
        return CaptureOutcome(capture_id=got.capture_id, url=f"{self._base_url}{got.url or ''}")

    # -- the link thread ---------------------------------------------------------------------------
    def on_answer(self, msg: RequestCaptureAnswer) -> None:
        with self._lock:
            answer = self._pending.get(msg.ask)
        if answer is None:  # the request stopped waiting and released its ask: nothing to do
            return
        _hand_over(answer, msg)

    def on_disconnect(self) -> None:
        """The sidecar went away: no answer will come; every waiting request goes on now."""
        with self._lock:
            waiting = list(self._pending.items())
        for ask_id, answer in waiting:
            _hand_over(answer, RequestCaptureAnswer(ask=ask_id, skipped="the sidecar disconnected before answering"))


def _hand_over(answer: asyncio.Future, msg: RequestCaptureAnswer) -> None:
    """Resolve ``answer`` on its own loop (from the link thread)."""
    try:
        answer.get_loop().call_soon_threadsafe(_resolve, answer, msg)
    except RuntimeError:  # that loop has closed: nobody waits any more
        pass


def _resolve(answer: asyncio.Future, msg: RequestCaptureAnswer) -> None:
    if not answer.done():  # the waiting task may have timed out or been cancelled meanwhile
        answer.set_result(msg)
