"""The probe channel (``PROBE_WS_PATH``): one websocket per engine process.

No credentials travel: the upgrade is open to anyone, and the handshake proves the token both ways
(sidecar/common/auth.py, docs/api.md "Probe authentication"). The first frame must be the probe's ``Hello``
(with its nonce): a probe of another protocol version, or any other bad hello, is refused with close
code 4400 and the reason (logged in full, naming both versions). The sidecar answers ``Challenge``: its
own nonce and its proof that it knows the token. The next frame must be the probe's ``Proof``; anything
else, or a wrong proof, is refused with 4400 and logged, and only a probe whose proof checks out is
registered and sent anything more. Every later frame is decoded and validated as a whole
(``protocol_codec.decode_from_probe``) before anything of it is applied; a malformed one is logged and
dropped, and the connection goes on. Clock probes go out from the moment a probe is registered
(sidecar/service/channel/clock_sync.py) and their replies feed its clock estimate. The step alarm goes out then
too, where the hello asks for it and a single-event step rule exists (sidecar/service/channel/registry.py). Heartbeats update the process's step count and sync watch;
job reports go to the job board, which routes them by job id; a request's ask for a capture (and its
release) to sidecar/service/jobs/request_captures.py.

On shutdown every probe websocket, registered or still in its handshake, is closed (1001, going
away) with a bounded wait: aiohttp waits for open handlers before it exits (``shutdown_timeout``,
60 s by default), and a websocket's handler only ends when its connection does, which left the
sidecar waiting 9-17 s on SIGTERM for its probes' own heartbeat timeouts. The probes reconnect, with
backoff, to the next sidecar.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import WSCloseCode, WSMsgType, web

from ...common import auth
from ...common.protocol import (CLOSE_REFUSED, PROBE_MARKERS_DIR, PROBE_WS_PATH, Answer, CaptureReport, Challenge, ClockReply,
                        FileChunk, Heartbeat, Hello, Proof, RequestCapture, RequestCaptureRelease, SyncReport)
from ...common.protocol_codec import ProtocolError, ProtocolVersionError, decode_from_probe, decode_hello, encode
from ...common.protocol import ModuleReport
from ...common.protocol import MemoryReport
from ..channel import file_fetch
from ..channel.clock_sync import keep_probing
from ..jobs.board import JobBoard
from .keys import JOBS, QUERIES, REGISTRY, SETTINGS
from ..channel.queries import QueryBroker
from ..channel.registry import ProbeConnection, ProbeRegistry
from ..jobs.request_captures import RequestCaptures
from .keys import REQUEST_CAPTURES

log = logging.getLogger(__name__)

HELLO_TIMEOUT_S = 10.0  # for the hello, then for the proof
MAX_CLOSE_REASON = 123  # a close frame's payload is at most 125 bytes, 2 of them the code
MAX_MESSAGE_BYTES = 1 << 20
CLOSE_TIMEOUT_S = 1.0  # at shutdown: how long the probes have to answer the close, all together

# Every probe websocket open now, handshake or not (the registry holds only authenticated ones).
PROBE_SOCKETS = web.AppKey("probe_sockets", set)


def close_reason(text: str) -> bytes:
    """``text`` as a close frame's reason: UTF-8, cut to fit, never in the middle of a character."""
    return text.encode()[:MAX_CLOSE_REASON].decode(errors="ignore").encode()


async def probe_ws(request: web.Request) -> web.StreamResponse:
    app = request.app
    ws = web.WebSocketResponse(heartbeat=10, max_msg_size=MAX_MESSAGE_BYTES)
    await ws.prepare(request)
    sockets = app[PROBE_SOCKETS]
    sockets.add(ws)
    try:
        await _session(request, ws)
    finally:
        sockets.discard(ws)
    return ws


async def _session(request: web.Request, ws: web.WebSocketResponse) -> None:
    app = request.app
    hello = await _receive_hello(ws, request.remote)
    if hello is None:
        return
    if not await _authenticate(ws, hello, app[SETTINGS].probe_token, request.remote):
        return
    shared = file_fetch.shares_files(hello.files_at, hello.marker, PROBE_MARKERS_DIR)
    # A probe whose hello says step_alarm is sent the rules' lowest step threshold now (registry.py).
    conn = app[REGISTRY].add(hello.process, ws, shares_files=shared, step_alarm=hello.step_alarm)
    log.info("probe connected: %s%s", conn.identity.label, "" if shared else " (its files come over the channel)")
    clock = asyncio.ensure_future(keep_probing(conn.clock, conn.send))
    try:
        await _serve(ws, conn, app[REGISTRY], app[JOBS], app[QUERIES], app[REQUEST_CAPTURES])
    finally:
        clock.cancel()
        file_fetch.fail_all(conn, "the process disconnected")
        app[REGISTRY].remove(conn)
        log.info("probe disconnected: %s", conn.identity.label)
        app[QUERIES].on_probe_lost(conn)
        await app[JOBS].on_probe_lost(conn)


async def _receive_hello(ws: web.WebSocketResponse, peer: str | None) -> Hello | None:
    try:
        first = await ws.receive(timeout=HELLO_TIMEOUT_S)
    except asyncio.TimeoutError:
        log.warning("probe at %s sent no hello within %g s", peer, HELLO_TIMEOUT_S)
        await ws.close(code=CLOSE_REFUSED, message=close_reason("no hello"))
        return None
    if first.type == WSMsgType.BINARY:  # the channel is JSON text: refused as any bad hello is
        reason = "bad hello: a binary frame (the probe channel takes text frames of JSON)"
        log.warning("probe at %s refused: %s", peer, reason)
        await ws.close(code=CLOSE_REFUSED, message=close_reason(reason))
        return None
    if first.type != WSMsgType.TEXT:  # closed or broken: nothing to refuse
        return None
    try:
        return decode_hello(first.data)
    except ProtocolVersionError as exc:
        log.warning("probe at %s refused: %s", peer, exc)
        reason = str(exc)
    except ProtocolError as exc:
        log.warning("probe at %s refused: bad hello: %s", peer, exc)
        reason = f"bad hello: {exc}"
    await ws.close(code=CLOSE_REFUSED, message=close_reason(reason))
    return None


async def _authenticate(ws: web.WebSocketResponse, hello: Hello, token: str, peer: str | None) -> bool:
    """Prove the token to the probe, then check the probe's proof. False: refused and closed."""
    nonce = auth.new_nonce()
    await ws.send_str(encode(Challenge(nonce=nonce, proof=auth.sidecar_proof(token, hello.nonce, nonce))))
    reason = "no proof"
    try:
        frame = await ws.receive(timeout=HELLO_TIMEOUT_S)
    except asyncio.TimeoutError:
        reason = f"no proof within {HELLO_TIMEOUT_S:g} s"
    else:
        if frame.type not in (WSMsgType.TEXT, WSMsgType.BINARY):  # closed or broken: nothing to refuse
            log.info("probe %r at %s left before its proof (one with another token leaves at the sidecar's)",
                     hello.process.label, peer)
            return False
        try:
            if frame.type == WSMsgType.BINARY:
                raise ProtocolError("a binary frame (the probe channel takes text frames of JSON)")
            msg = decode_from_probe(frame.data)
        except ProtocolError as exc:
            msg, reason = None, f"bad proof: {exc}"
        if isinstance(msg, Proof):
            if auth.probe_proof_ok(token, nonce, hello.nonce, msg.proof):
                return True
            reason = "wrong proof: this probe does not know the sidecar's token"
        elif msg is not None:
            reason = f"expected the probe's proof, got {type(msg).__name__}"
    log.warning("probe %r at %s refused: %s", hello.process.label, peer, reason)
    await ws.close(code=CLOSE_REFUSED, message=close_reason(reason))
    return False


async def _serve(ws: web.WebSocketResponse, conn: ProbeConnection, registry: ProbeRegistry, jobs: JobBoard,
                 queries: QueryBroker, request_captures: RequestCaptures) -> None:
    dropped = 0
    async for frame in ws:
        if frame.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            break
        try:
            if frame.type == WSMsgType.BINARY:  # malformed like any other bad frame: dropped, the link goes on
                raise ProtocolError("a binary frame (the probe channel takes text frames of JSON)")
            msg = decode_from_probe(frame.data)
            if isinstance(msg, (Hello, Proof)):
                raise ProtocolError(f"a second {type(msg).__name__.lower()} on the same connection")
        except ProtocolError as exc:
            dropped += 1
            # A probe that sends one bad frame likely sends many: warn once, count the rest.
            (log.warning if dropped == 1 else log.debug)("probe %s: message dropped: %s", conn.identity.label, exc)
            continue
        if isinstance(msg, Heartbeat):
            registry.observe_heartbeat(conn, msg, time.time())
        elif isinstance(msg, (CaptureReport, SyncReport, ModuleReport, MemoryReport)):
            await jobs.on_report(conn, msg)
        elif isinstance(msg, Answer):
            queries.on_answer(conn, msg)
        elif isinstance(msg, RequestCapture):
            request_captures.on_ask(conn, msg)
        elif isinstance(msg, RequestCaptureRelease):
            await request_captures.on_release(conn, msg)
        elif isinstance(msg, ClockReply):
            conn.clock.on_reply(msg)
        elif isinstance(msg, FileChunk):
            file_fetch.on_chunk(conn, msg)
    if dropped > 1:
        log.warning("probe %s: %d malformed messages dropped on this connection", conn.identity.label, dropped)


async def close_probe_sockets(app: web.Application) -> None:
    """Close every probe websocket at once, waiting at most ``CLOSE_TIMEOUT_S`` for the probes' answers;
    a probe that does not answer in time (its process stuck, its host gone) has its connection dropped."""
    closing = [asyncio.ensure_future(ws.close(code=WSCloseCode.GOING_AWAY, message=b"sidecar shutting down"))
               for ws in list(app[PROBE_SOCKETS])]
    if not closing:
        return
    _, late = await asyncio.wait(closing, timeout=CLOSE_TIMEOUT_S)
    for task in late:
        task.cancel()  # WebSocketResponse.close, cancelled, closes the transport
    await asyncio.gather(*closing, return_exceptions=True)


async def processes(request: web.Request) -> web.Response:
    """``GET /processes``: the engine processes connected over this channel."""
    return web.json_response({"processes": [c.to_json() for c in request.app[REGISTRY].all()]})


def add_probe_channel(app: web.Application) -> None:
    app[PROBE_SOCKETS] = set()
    app[QUERIES] = QueryBroker()
    app.router.add_get(PROBE_WS_PATH, probe_ws, allow_head=False)  # a HEAD cannot become a websocket
    app.add_routes([web.get("/processes", processes)])
    # on_shutdown runs before aiohttp waits for the open handlers (cleanup_ctx only after that wait).
    app.on_shutdown.append(close_probe_sockets)
