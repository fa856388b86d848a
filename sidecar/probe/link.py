"""The probe's connection to the sidecar: a daemon thread with its own asyncio loop and websocket.

The engine never depends on the sidecar: if it is absent, killed or restarted, the link retries with
backoff and the engine is never told. Nothing here runs on the engine's step path; messages the step
thread wants to send are handed over with ``call_soon_threadsafe`` and encoded on the link thread.

Every frame is a typed message (sidecar.protocol): the first one sent is the probe's ``Hello``; every
frame received is decoded and validated in one call, and a malformed one is logged and dropped, never
half-applied. A sidecar that refuses the hello (another protocol version: the reason names both)
closes the connection with ``CLOSE_REFUSED`` and its reason, which is logged as a warning.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Callable

import aiohttp

from .. import auth
from ..protocol import CLOSE_REFUSED, PROBE_WS_PATH, FromSidecar, Heartbeat, Hello, ProtocolError, decode_from_sidecar, encode

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 5.0


class SidecarLink:
    def __init__(
        self,
        endpoint: str,
        hello: Hello,
        on_message: Callable[[FromSidecar], None],
        on_disconnect: Callable[[], None],
        heartbeat: Callable[[], Heartbeat],
        token_provider: Callable[[], str | None] = auth.read_token,
        warmup: Callable[[], None] | None = None,
    ) -> None:
        self._url = endpoint.rstrip("/") + PROBE_WS_PATH
        self._hello = encode(hello)
        self._on_message = on_message
        self._on_disconnect = on_disconnect
        self._heartbeat = heartbeat
        self._token_provider = token_provider
        self._warmup = warmup
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None  # connect, serve, reconnect: until close()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._stopping = False
        self._refusal: str | None = None  # the last version refusal logged (reconnects repeat it)
        self._thread = threading.Thread(target=self._run, name="inference-sidecar-link", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Stop reconnecting and leave the sidecar: the connection is closed as a websocket close,
        so the sidecar sees the probe go at once."""
        self._stopping = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._cancel_main)
            except RuntimeError:  # loop closed between the check and the call
                pass
        self._thread.join(timeout)

    def _cancel_main(self) -> None:
        if self._main is not None:
            self._main.cancel()

    def send(self, msg) -> None:
        """Queue a message (a sidecar.protocol struct) from any thread; dropped if not connected (the
        sidecar re-learns state)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._send_now, msg)
        except RuntimeError:  # loop closed between the check and the call
            pass

    def _send_now(self, msg) -> None:
        ws = self._ws
        if ws is not None and not ws.closed:
            asyncio.ensure_future(self._safe_send(ws, msg))

    @staticmethod
    async def _safe_send(ws, msg) -> None:
        try:
            frame = encode(msg)
        except Exception as exc:  # a report that cannot be encoded must not kill the link
            log.warning("inference-sidecar: %s not sent to the sidecar: %s", type(msg).__name__, exc)
            return
        try:
            await ws.send_str(frame)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            pass

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            if self._warmup is not None:
                self._warmup()
            self._main = loop.create_task(self._connect_forever())
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:  # close()
            pass
        except Exception:  # never let the thread die loudly inside an engine
            log.exception("inference-sidecar: probe link stopped")
        finally:
            loop.close()

    async def _connect_forever(self) -> None:
        backoff = BACKOFF_MIN_S
        timeout = aiohttp.ClientTimeout(total=None, connect=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stopping:
                token = self._token_provider()
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                try:
                    async with session.ws_connect(self._url, headers=headers, heartbeat=10) as ws:
                        await ws.send_str(self._hello)
                        self._ws = ws
                        self.connected.set()
                        backoff = BACKOFF_MIN_S
                        await self._serve(ws)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403):
                        log.warning("inference-sidecar: sidecar at %s refused this probe's token", self._url)
                finally:
                    if self._ws is not None:
                        self._ws = None
                        self.connected.clear()
                        self._on_disconnect()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        beat = asyncio.ensure_future(self._beat(ws))
        try:
            while True:
                frame = await ws.receive()
                if frame.type == aiohttp.WSMsgType.TEXT:
                    self._deliver(frame.data)
                    continue
                if frame.type == aiohttp.WSMsgType.CLOSE:
                    self._closed_by_sidecar(frame.data, frame.extra)
                break  # closed, closing, an error or a binary frame: this connection is over
        finally:
            beat.cancel()

    def _deliver(self, frame: str) -> None:
        try:
            msg = decode_from_sidecar(frame)
        except ProtocolError as exc:
            log.warning("inference-sidecar: malformed message from the sidecar dropped: %s", exc)
            return
        try:
            self._on_message(msg)
        except Exception:
            log.exception("inference-sidecar: %s from the sidecar not applied", type(msg).__name__)

    def _closed_by_sidecar(self, code, reason) -> None:
        if code != CLOSE_REFUSED:
            return
        reason = f"the sidecar at {self._url} refused this probe: {reason or f'close code {code}'}"
        # The link reconnects (the sidecar may be upgraded) and is refused again: say it once.
        if reason != self._refusal:
            self._refusal = reason
            log.warning("inference-sidecar: %s", reason)
        else:
            log.debug("inference-sidecar: %s", reason)

    async def _beat(self, ws) -> None:
        while not ws.closed:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                beat = self._heartbeat()
            except Exception:  # a heartbeat skipped, not every later one
                log.debug("inference-sidecar: heartbeat not built", exc_info=True)
                continue
            await self._safe_send(ws, beat)
