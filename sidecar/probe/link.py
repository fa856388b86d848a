"""The probe's connection to the sidecar: a daemon thread with its own asyncio loop and websocket.

The engine never depends on the sidecar: if it is absent, killed or restarted, the link retries with
backoff and the engine is never told. Nothing here runs on the engine's step path; messages the step
thread wants to send are handed over with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from typing import Any, Callable

import aiohttp

from .. import auth
from ..protocol import PROBE_WS_PATH, ProcessIdentity

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
BACKOFF_MIN_S = 0.2
BACKOFF_MAX_S = 5.0


class SidecarLink:
    def __init__(
        self,
        endpoint: str,
        identity: ProcessIdentity,
        on_message: Callable[[dict[str, Any]], None],
        on_disconnect: Callable[[], None],
        heartbeat: Callable[[], dict[str, Any]],
        token_provider: Callable[[], str | None] = auth.read_token,
        warmup: Callable[[], None] | None = None,
    ) -> None:
        self._url = endpoint.rstrip("/") + PROBE_WS_PATH
        self._identity = identity
        self._on_message = on_message
        self._on_disconnect = on_disconnect
        self._heartbeat = heartbeat
        self._token_provider = token_provider
        self._warmup = warmup
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="inference-sidecar-link", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float = 2.0) -> None:
        self._stopping = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        self._thread.join(timeout)

    def send(self, msg: dict[str, Any]) -> None:
        """Queue a message from any thread; dropped if not connected (the sidecar re-learns state)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._send_now, msg)
        except RuntimeError:  # loop closed between the check and the call
            pass

    def _send_now(self, msg: dict[str, Any]) -> None:
        ws = self._ws
        if ws is not None and not ws.closed:
            asyncio.ensure_future(self._safe_send(ws, msg))

    @staticmethod
    async def _safe_send(ws, msg) -> None:
        try:
            await ws.send_str(json.dumps(msg))
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            pass

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            if self._warmup is not None:
                self._warmup()
            loop.run_until_complete(self._connect_forever())
        except RuntimeError:  # loop.stop() from close()
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
                        await ws.send_str(json.dumps(self._identity.to_hello()))
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
            async for raw in ws:
                if raw.type != aiohttp.WSMsgType.TEXT:
                    break
                try:
                    msg = json.loads(raw.data)
                    self._on_message(msg)
                except Exception:
                    log.exception("inference-sidecar: bad message from sidecar")
        finally:
            beat.cancel()

    async def _beat(self, ws) -> None:
        while not ws.closed:
            await asyncio.sleep(HEARTBEAT_S)
            await self._safe_send(ws, {"type": "heartbeat", **self._heartbeat()})
