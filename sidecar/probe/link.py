"""The probe's connection to the sidecar: a daemon thread with its own asyncio loop and websocket.

The engine never depends on the sidecar: if it is absent, killed or restarted, the link retries with
backoff and the engine is never told. Nothing here runs on the engine's step path; messages the step
thread wants to send are handed over with ``call_soon_threadsafe`` and encoded on the link thread.

Whatever listens on the sidecar's port is not trusted until it proves it knows the token: the link
connects with no credentials, sends its ``Hello`` with a fresh nonce and waits for the ``Challenge``
(sidecar/common/protocol.py, sidecar/common/auth.py). A server whose proof is wrong, or that answers anything else,
is left at once: the link sends nothing more on that connection (no proof, heartbeat or report),
acts on nothing it sent, warns once ("a port squatter?") and keeps reconnecting with backoff. Only
after the proof checks out does it send its own ``Proof`` and serve: every frame received is then
decoded and validated in one call, and a malformed one is logged and dropped, never half-applied. A
sidecar that refuses the probe (another protocol version, a wrong proof: the reason says) closes the
connection with ``CLOSE_REFUSED`` and its reason, which is logged as a warning. With no token at all
the link does not connect; it says why once and looks for the token again at each retry (a sidecar
started after the engine writes the token file).

Heartbeats go every ``HEARTBEAT_S``, and early when the heartbeat's source says one is due
(``early_heartbeat``: the step alarm, sidecar/probe/heartbeat.py): while it watches, the link thread wakes
every ``EARLY_POLL_S`` to ask it, a timer on its own loop (no busy wait, nothing on the step path);
otherwise it sleeps until the next beat. ``wake_heartbeat`` makes it look again at once (an alarm
just set).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Callable

import aiohttp

from ..common import auth, config
from ..common.protocol import (CLOSE_REFUSED, PROBE_WS_PATH, Challenge, ClockProbe, ClockReply, FromSidecar, Heartbeat, Hello,
                        ProcessIdentity, Proof)
from ..common.protocol_codec import PROTOCOL_VERSION, ProtocolError, decode_from_sidecar, encode

log = logging.getLogger(__name__)

HEARTBEAT_S = 2.0
# While the step alarm watches: how often the link thread looks at the step ring (s). A slow step's
# early heartbeat leaves at most this long after the step ended (plus the alarm's own rate limit).
EARLY_POLL_S = 0.1
BACKOFF_MIN_S = 0.2
# At most 2 s between tries: a restarted sidecar has every engine process back within about 2 s of
# serving (issue 10 asks for a capture within 5 s of a restart); a refused connect costs next to nothing.
BACKOFF_MAX_S = 2.0
CHALLENGE_TIMEOUT_S = 10.0  # how long the server has to answer the hello
MAX_MESSAGE_BYTES = 1 << 20


class SidecarLink:
    def __init__(
        self,
        endpoint: str,
        process: ProcessIdentity,
        on_message: Callable[[FromSidecar], None],
        on_disconnect: Callable[[], None],
        heartbeat: Callable[[], Heartbeat],
        token_provider: Callable[[], str | None] = auth.read_token,
        warmup: Callable[[], None] | None = None,
        protocol: int = PROTOCOL_VERSION,
        files_at: str = "",
        marker: str = "",
        before_hello: Callable[[], None] | None = None,
        early_heartbeat: Callable[[float], bool | None] | None = None,
    ) -> None:
        """``files_at``, ``marker``: the probe's trace root and its marker file there (``hello``).
        ``before_hello``: called on the link thread before each connection's hello (the probe
        touches its marker there, so that the sidecar finds it even where it was cleared).
        ``early_heartbeat(now)`` (``time.monotonic()``), on the link thread: None, nothing to watch;
        False, nothing now (asked again in ``EARLY_POLL_S``); True, send a heartbeat now. Given, the
        hello says ``step_alarm``: the sidecar may send the alarm this watches."""
        self._url = endpoint.rstrip("/") + PROBE_WS_PATH
        self._process = process
        self._protocol = protocol
        self._files_at, self._marker = files_at, marker
        self._before_hello = before_hello
        self._on_message = on_message
        self._on_disconnect = on_disconnect
        self._heartbeat = heartbeat
        self._token_provider = token_provider
        self._warmup = warmup
        self._early_heartbeat = early_heartbeat
        self._nap: asyncio.Future | None = None  # the heartbeat loop's wait, which wake_heartbeat ends
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task | None = None  # connect, serve, reconnect: until close()
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._stopping = False
        self._said: dict[str, str] = {}  # the last warning of each kind (reconnects repeat them)
        self._thread = threading.Thread(target=self._run, name="inference-sidecar-link", daemon=True)
        self.connected = threading.Event()  # the sidecar proved it knows the token; the probe serves it

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
        if self._thread.is_alive():  # a link closed before it was started has no thread to join
            self._thread.join(timeout)

    def wake_heartbeat(self) -> None:
        """From any thread: the heartbeat loop looks at ``early_heartbeat`` again now (its watch
        changed), rather than when its current wait ends."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._end_nap)
        except RuntimeError:  # loop closed between the check and the call
            pass

    def _end_nap(self) -> None:
        nap = self._nap
        if nap is not None and not nap.done():
            nap.set_result(None)

    def _cancel_main(self) -> None:
        if self._main is not None:
            self._main.cancel()

    def send(self, msg) -> None:
        """Queue a message (a sidecar.common.protocol struct) from any thread; dropped if not connected (the
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
                if not token:
                    self._warn_once("no token", f"no token: neither ${config.ENV_TOKEN} nor the token file "
                                    f"{config.token_file()} (written by a sidecar of this user when it starts); "
                                    f"not connecting to {self._url} until there is one")
                else:
                    try:
                        # No credentials on the wire: the handshake proves the token both ways.
                        async with session.ws_connect(self._url, heartbeat=10, max_msg_size=MAX_MESSAGE_BYTES) as ws:
                            if await self._handshake(ws, token):
                                self._ws = ws
                                self.connected.set()
                                backoff = BACKOFF_MIN_S
                                await self._serve(ws)
                    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                        if isinstance(exc, aiohttp.WSServerHandshakeError) and exc.status in (401, 403):
                            self._warn_once("http refusal", f"the server at {self._url} refused the websocket "
                                            f"upgrade ({exc.status}): a sidecar older than protocol "
                                            f"{PROTOCOL_VERSION}? Install one inference-sidecar version on both sides")
                    finally:
                        if self._ws is not None:
                            self._ws = None
                            self.connected.clear()
                            self._on_disconnect()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _handshake(self, ws: aiohttp.ClientWebSocketResponse, token: str) -> bool:
        """Hello, the server's challenge checked, then this probe's proof. False: the connection is
        left, and nothing but the hello was sent on it."""
        nonce = auth.new_nonce()
        if self._before_hello is not None:
            self._before_hello()
        await ws.send_str(encode(Hello(protocol=self._protocol, process=self._process, nonce=nonce,
                                       files_at=self._files_at, marker=self._marker,
                                       step_alarm=self._early_heartbeat is not None)))
        try:
            frame = await ws.receive(timeout=CHALLENGE_TIMEOUT_S)
        except asyncio.TimeoutError:
            frame = None  # no answer: no proof
        if frame is not None and frame.type == aiohttp.WSMsgType.CLOSE:
            self._closed_by_sidecar(frame.data, frame.extra)
            return False
        if frame is not None and frame.type in (aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                                                aiohttp.WSMsgType.ERROR):
            return False  # the connection broke: nothing was proven either way
        challenge = None
        if frame is not None and frame.type == aiohttp.WSMsgType.TEXT:
            try:
                challenge = decode_from_sidecar(frame.data)
            except ProtocolError:
                pass
        if not isinstance(challenge, Challenge) or not auth.sidecar_proof_ok(token, nonce, challenge.nonce,
                                                                             challenge.proof):
            await ws.close()
            self._warn_once("squatter", f"the server at {self._url} did not prove it knows the token: not this "
                            "host's sidecar (a port squatter?) or a sidecar with another token; sending it "
                            "nothing, retrying")
            return False
        await ws.send_str(encode(Proof(proof=auth.probe_proof(token, challenge.nonce, nonce))))
        return True

    def _warn_once(self, kind: str, text: str) -> None:
        """A warning the first time, debug while it repeats (the link retries for as long as it runs)."""
        (log.debug if self._said.get(kind) == text else log.warning)("inference-sidecar: %s", text)
        self._said[kind] = text

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
            if isinstance(msg, Challenge):
                raise ProtocolError("a second challenge on the same connection")
        except ProtocolError as exc:
            log.warning("inference-sidecar: malformed message from the sidecar dropped: %s", exc)
            return
        if isinstance(msg, ClockProbe):
            # Answered here, at once: the reply's clock reading is the sample, so nothing may come
            # between the frame's arrival and it (sidecar/service/channel/clock_sync.py).
            self._send_now(ClockReply(seq=msg.seq, probe_ns=time.time_ns()))
            return
        try:
            self._on_message(msg)
        except Exception:
            log.exception("inference-sidecar: %s from the sidecar not applied", type(msg).__name__)

    def _closed_by_sidecar(self, code, reason) -> None:
        if code != CLOSE_REFUSED:
            return
        # The reason is the server's text, shown as text (it may not be our sidecar's).
        reason = "".join(c if c.isprintable() else "?" for c in str(reason or f"close code {code}"))
        # The link reconnects (the sidecar may be upgraded) and is refused again: say it once.
        self._warn_once("refused", f"the sidecar at {self._url} refused this probe: {reason}")

    async def _beat(self, ws) -> None:
        """A heartbeat every ``HEARTBEAT_S``, and one whenever ``early_heartbeat`` says so."""
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + HEARTBEAT_S
        while not ws.closed:
            wait = next_beat - loop.time()
            if wait <= 0:
                next_beat = loop.time() + HEARTBEAT_S
                await self._send_heartbeat(ws)
                continue
            early = None
            if self._early_heartbeat is not None:
                try:
                    early = self._early_heartbeat(time.monotonic())
                except Exception:  # the watch skipped once, never the regular beats
                    log.debug("inference-sidecar: step alarm not checked", exc_info=True)
                    early = False
                if early:
                    await self._send_heartbeat(ws)
            await self._wait(min(wait, EARLY_POLL_S) if early is not None else wait)

    async def _wait(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when ``wake_heartbeat`` is called: one future and one timer on
        this loop (``asyncio.wait_for`` on an event would make a task each time)."""
        loop = asyncio.get_running_loop()
        nap = self._nap = loop.create_future()
        timer = loop.call_later(max(0.0, seconds), self._end_nap)
        try:
            await nap
        finally:
            timer.cancel()
            self._nap = None

    async def _send_heartbeat(self, ws) -> None:
        try:
            beat = self._heartbeat()
        except Exception:  # a heartbeat skipped, not every later one
            log.debug("inference-sidecar: heartbeat not built", exc_info=True)
            return
        await self._safe_send(ws, beat)
