"""A fuzz of the probe channel, ``GET /probe/ws`` (issue 27: bad input stays at zero): hundreds of bad inputs
at each point of a connection, and what the sidecar must do with them (docs/api.md, "Probe
authentication"; sidecar/service/routes/probe_channel.py):

- in place of the hello: garbage text, JSON of the wrong shape, a hello with each of its fields bad
  (another protocol version, a bad nonce, a bad process identity, ...), a proof, another message, a binary
  frame, a frame over the channel's 1 MiB limit, frames the websocket protocol forbids (invalid UTF-8, a
  continuation with nothing to continue, a reserved opcode, an oversized ping, a malformed close): a
  refusal, close code 4400 with the reason, or the RFC 6455 code aiohttp's reader answers a frame it cannot
  read (1002 protocol error, 1007 invalid UTF-8, 1009 too big);
- in place of the proof, after a good hello: the same, and proofs that are wrong: 4400;
- after the handshake: malformed frames are dropped and the connection goes on (a heartbeat sent after
  them is seen), and the messages of every type with hostile values leave the routes that show what
  probes said (``/processes``, ``/healthz``, ``/syncs/watch``, ``/metrics``) answering without a 5xx;
- frames after a refusal (pipelined behind the bad one) change nothing;
- the upgrade itself with odd headers (versions, keys, methods, Host, Origin, Sec-Fetch-*): 101, or an
  error in JSON (the browser guard's 403 where its rules say, docs/security.md), never a 5xx.

Throughout: no ERROR logged with a traceback through the sidecar's code (an exception a handler did not
handle), the sidecar stays healthy (``/healthz``), and a good probe still connects afterwards (the helpers
of tests/service/test_probe_channel.py).

Bounded: every connection is driven to its end within ``SESSION_BOUND_S``; ``derandomize=True`` and
``database=None`` as in test_fuzz_api.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import json
import logging
import struct
import traceback
from pathlib import Path

import pytest
from aiohttp import ClientError, WSMsgType
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, given, settings, strategies as st

import sidecar
from sidecar.common import auth
from sidecar.common.protocol import CLOSE_REFUSED, PROBE_WS_PATH, Challenge
from sidecar.common.protocol_codec import PROTOCOL_VERSION, decode_from_sidecar
from sidecar.service.app import make_app
from sidecar.service.routes.keys import REGISTRY
from sidecar.service.routes.probe_channel import MAX_MESSAGE_BYTES, PROBE_SOCKETS

from service_fakes import identity
from test_fuzz_api import (BROWSER_VALUES, JSON_VALUE, JsonErrorsTestServer, browser_headers, check_answer, guard_outcome,
                           guard_outcomes, parser_refuses, resolve_browser_headers, service_settings)
from test_probe_channel import TOKEN, connect, processes

SESSION_BOUND_S = 30.0  # one connection, start to end: only a hang comes near it
SIDECAR_CODE = str(Path(sidecar.__file__).parent)
TOO_BIG = MAX_MESSAGE_BYTES + 16
DEEP = 5000  # JSON nested deeper than the interpreter's recursion limit: 10 KB of brackets


# -- what is sent --------------------------------------------------------------------------------------------
# A frame: ("text", str), ("binary", bytes), ("ping" | "pong", bytes), ("close", payload) a well-formed close
# from the client, or ("bad", opcode, payload, code): a frame the websocket protocol forbids, and the code
# aiohttp's reader closes with.

def _deep(depth: int = DEEP) -> str:
    return "[" * depth + "]" * depth


def process_json(**changes) -> dict:
    ident = identity("api_server")  # a window process: a request_capture it sends starts nothing here
    fields = {f: getattr(ident, f) for f in ("role", "role_label", "step_driven", "pid", "rank", "host", "cuda",
                                             "engine")}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not _DROP}


_DROP = object()
GOOD_NONCE = "0123456789abcdef" * 4


def hello_json(nonce: str = GOOD_NONCE, **changes) -> dict:
    fields = {"type": "hello", "protocol": PROTOCOL_VERSION, "process": process_json(), "nonce": nonce}
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not _DROP}


# Hellos that are each bad in one way: never a valid one.
BAD_HELLOS = [json.dumps(h) for h in [
    *[hello_json(protocol=v) for v in (PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1, -1, 0, str(PROTOCOL_VERSION),
                                       float(PROTOCOL_VERSION), True, None, [], {}, 2 ** 64, 1e308, "x" * 5000)],
    *[hello_json(**{name: _DROP}) for name in ("type", "protocol", "process", "nonce")],
    *[hello_json(type=v) for v in ("Hello", "HELLO", "hello ", "proof", "heartbeat", None, 1, [])],
    *[hello_json(nonce=v) for v in ("", "0" * 63, "0" * 65, "g" * 64, "A" * 64, "0" * 64 + "\n", 0, None, ["0" * 64])],
    *[hello_json(process=v) for v in (None, [], "worker", {}, 1)],
    *[hello_json(process=process_json(role=v)) for v in ("Worker!", "", "a" * 33, "1abc", "ro le", None, 5,
                                                          "\u0430pi_server")],
    *[hello_json(process=process_json(pid=v)) for v in (0, -1, "1", 1.5, None, 1e30)],
    *[hello_json(process=process_json(rank=v)) for v in (-1, "0", 1.5)],
    *[hello_json(process=process_json(step_driven=v)) for v in ("yes", None, 1)],
    *[hello_json(process=process_json(**{name: _DROP})) for name in ("role", "role_label", "step_driven", "pid")],
    hello_json(process=process_json(role_label="x" * 5000)), hello_json(process=process_json(host="h" * 4097)),
    *[hello_json(process=process_json(extra=v)) for v in ([], {"a": [1]}, {"a": {"b": 1}}, "x")],
    *[hello_json(process=process_json(probe_id=v)) for v in ("XYZ", "0" * 33, 5)],
    *[hello_json(files_at=v) for v in ("x" * 4097, 5, None)],
    *[hello_json(marker=v) for v in ("bad marker", "../../etc/passwd", 5, "1-" + "0" * 32)],
]]
# JSON nested beyond any parser's depth where a hello, a proof or a heartbeat holds anything, or ignores it.
DEEP_FRAMES = [
    '{"type": "hello", "protocol": %s}' % _deep(),
    json.dumps(hello_json())[:-1] + ', "unknown": %s}' % _deep(),
    '{"type": "proof", "unknown": %s, "proof": "%s"}' % (_deep(), "0" * 64),
    '{"type": "heartbeat", "steps": 1, "stuck": {"a": %s}}' % _deep(),
    '{"type": "heartbeat", "steps": 1, "sync_watch": %s}' % ('{"a":' * DEEP + "1" + "}" * DEEP),
    _deep(),
]
GARBAGE = [
    "", " ", "not json", "{", "}", "[]", "[1, 2]", "null", "0", '"hello"', "{}", '{"type": null}', '{"type": "hello"}',
    '{"type": "no-such-type"}', '{"type": "proof"}', '{"type": "proof", "proof": "zz"}', "\ufeff{}", "NaN",
    "Infinity", '{"type": "heartbeat", "steps": 1e400}', '{"a": 1,}', "\x00", "\u2028", '{"type": "hello"' + "}" * 1000,
    "x" * 100_000, '{"type": "heartbeat", "steps": 1, "steps": -1}',
]
# Every message a probe sends, well-formed (here: their values are the fuzz's to spoil).
TEMPLATES = [
    {"type": "heartbeat", "steps": 5},
    {"type": "capture", "job_id": "20260101-000000-abcdef", "state": "armed", "steps_seen": 1},
    {"type": "sync", "job_id": "s20260101-000000-abcdef", "state": "done", "sites": [{"path": "a.py", "line": 1}]},
    {"type": "modules", "job_id": "20260101-000000-abcdef", "state": "done",
     "rows": [{"path": "", "type": "M", "calls": 1, "total_ns": 1, "self_ns": 1}]},
    {"type": "answer", "query_id": 1, "kind": "stacks", "data": {}},
    {"type": "request_capture", "ask": 1, "request_id": "r1", "steps": 1},
    {"type": "request_capture_release", "ask": 1},
    {"type": "file_chunk", "file": "/tmp/x", "offset": 0, "size": 1, "data": "AA=="},
    {"type": "clock_reply", "seq": 1, "probe_ns": 1},
    {"type": "proof", "proof": "0" * 64},
]
HOSTILE_JSON = JSON_VALUE | st.sampled_from([-1, 0, 2 ** 63, 2 ** 64, 1e308, -1e308, "", "x" * 5000, None, [], {}, [[]],
                                             {"": None}, "../../etc/passwd", "\u0000", "\U0001F600", True,
                                             "20260101-000000-abcdef"])
FIELD_NAMES = st.sampled_from(["type", "steps", "job_id", "state", "sites", "rows", "data", "query_id", "kind", "ask",
                               "request_id", "file", "offset", "size", "seq", "probe_ns", "proof", "sync_watch",
                               "stuck", "in_flight", "open_step_ms", "error", "extra"]) | st.text(max_size=8)


@st.composite
def spoiled_message(draw) -> str:
    """A message of some type with up to three fields set to hostile values (it may stay valid)."""
    msg = dict(draw(st.sampled_from(TEMPLATES)))
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(msg)) | FIELD_NAMES)
        if draw(st.integers(0, 5)) == 0:
            msg.pop(name, None)
        else:
            msg[name] = draw(HOSTILE_JSON)
    return json.dumps(msg)


# Frames the websocket protocol forbids, with the code aiohttp closes with (RFC 6455, 7.4.1).
BAD_FRAMES = [
    ("bad", WSMsgType.TEXT, b"\xff\xfe not UTF-8", 1007),
    ("bad", WSMsgType.TEXT, b'{"type": "hello", "nonce": "\xc3\x28"}', 1007),
    ("bad", WSMsgType.CONTINUATION, b"nothing to continue", 1002),
    ("bad", 3, b"a reserved opcode", 1002),
    ("bad", 0xB, b"a reserved control opcode", 1002),
    ("bad", WSMsgType.PING, b"x" * 126, 1002),  # a control frame's payload is at most 125 bytes
    ("bad", WSMsgType.CLOSE, b"\x03", 1002),  # half a close code
    ("bad", WSMsgType.CLOSE, struct.pack("!H", 999), 1002),
    ("bad", WSMsgType.CLOSE, struct.pack("!H", 1005), 1002),  # a code no endpoint may send
    ("bad", WSMsgType.CLOSE, struct.pack("!H", 1000) + b"\xff", 1007),
]
CLOSES = [("close", b""), ("close", struct.pack("!H", 1000)), ("close", struct.pack("!H", 4000) + b"bye"),
          ("close", struct.pack("!H", 4400) + b"\xe2\x82\xac")]
BINARY = [("binary", b""), ("binary", b"\x00"), ("binary", b"\xff" * 10), ("binary", json.dumps(hello_json()).encode())]
TOO_BIG_FRAMES = [("text", "x" * TOO_BIG), ("text", '{"type": "hello", "pad": "' + " " * TOO_BIG + '"}'),
                  ("binary", b"\x00" * TOO_BIG)]
CONTROL = [("ping", b""), ("ping", b"ping"), ("pong", b"unasked")]

TEXT = st.sampled_from(GARBAGE + DEEP_FRAMES) | st.text(max_size=50) | JSON_VALUE.map(json.dumps) | spoiled_message()
FRAME = st.one_of(TEXT.map(lambda text: ("text", text)), st.sampled_from(BINARY + BAD_FRAMES + CLOSES + CONTROL),
                  st.binary(max_size=64).map(lambda data: ("binary", data)), st.sampled_from(TOO_BIG_FRAMES))
# In place of the hello: anything but a valid hello.
NOT_A_HELLO = st.one_of(st.sampled_from(BAD_HELLOS).map(lambda text: ("text", text)), FRAME)
# After the handshake: a second hello too (dropped: documented).
LATER = st.one_of(FRAME, st.just(("text", json.dumps(hello_json()))))

# The heartbeat that ends a session that goes on: well-formed, its values hostile where its type allows.
ANY_DICT = st.dictionaries(st.text(max_size=5), JSON_VALUE, max_size=3)
SYNC_WATCHES = ANY_DICT | st.sampled_from([
    None, {}, {"sites": [1]}, {"sites": "abc"}, {"sites": [{"count": "x"}]}, {"sites": [{}]}, {"sites": None},
    {"sites": [{"path": None, "line": [], "count": 1e308}]}, {"state": {"x": 1}, "every": "x"},
    {"state": "watching", "every": 16, "sites": []}])
HEARTBEAT_EXTRAS = st.fixed_dictionaries({}, optional={
    "sync_watch": SYNC_WATCHES,
    "stuck": st.sampled_from([None, {}, {"step": [1], "age_s": "x"}, {"since_ns": 2 ** 63}]) | ANY_DICT,
    "in_flight": st.sampled_from([None, {"count": 0}, {"count": 2 ** 63 - 1, "oldest_arrival_ns": 0},
                                  {"count": 1, "oldest_arrival_ns": 2 ** 63 - 1}]),
    "open_step_ms": st.sampled_from([None, 0, 1e308]), "slowest_step_ms": st.sampled_from([None, 0.0, 1e308]),
    "slowest_step": st.sampled_from([None, 0, 2 ** 63 - 1]),
})

# The upgrade request: the websocket handshake's headers, each odd at times, and a browser's.
UPGRADE_HEADERS = {
    "Upgrade": ["websocket", "WebSocket", "", "h2c", None],
    "Connection": ["Upgrade", "keep-alive, Upgrade", "close", "", None],
    "Sec-WebSocket-Version": ["13", "8", "", "abc", "13, 8", "99", None],
    "Sec-WebSocket-Key": ["dGhlIHNhbXBsZSBub25jZQ==", "", "short", "!!!!not base64!!!!!!!!==", "x" * 300, None],
    "Sec-WebSocket-Protocol": ["chat", "", ",,,", None],
    "Sec-WebSocket-Extensions": ["permessage-deflate", "permessage-deflate; client_max_window_bits=99",
                                 "permessage-deflate; server_max_window_bits=7", "x-unknown", None],
}
RAW_HOSTS = ["x\x01y", "x\x00y", "x\x7fy", "x\ry"]  # what the HTTP client refuses to send; the parser refuses it


@st.composite
def upgrades(draw) -> tuple[str, dict[str, str | None], dict, str | None]:
    method = draw(st.sampled_from(["GET", "GET", "GET", "POST", "HEAD", "OPTIONS", "DELETE"]))
    handshake = {name: draw(st.sampled_from(values)) for name, values in UPGRADE_HEADERS.items()}
    raw_host = draw(st.sampled_from(RAW_HOSTS)) if draw(st.integers(0, 9)) == 0 else None
    return method, handshake, draw(browser_headers()), raw_host


@st.composite
def sessions(draw):
    stage = draw(st.sampled_from(["hello", "hello", "proof", "registered", "registered", "upgrade"]))
    if stage == "upgrade":
        return stage, draw(upgrades()), None, False
    compress = draw(st.integers(0, 3)) == 0
    if stage == "registered":
        frames = draw(st.lists(LATER, min_size=1, max_size=4))
        return stage, frames, draw(HEARTBEAT_EXTRAS), compress
    lead = draw(st.lists(st.sampled_from(CONTROL), max_size=1))
    deciding = draw(NOT_A_HELLO) if stage == "hello" else draw(FRAME)
    while deciding[0] in ("ping", "pong"):  # a frame the sidecar reads, so that it has something to refuse
        deciding = draw(NOT_A_HELLO)
    return stage, lead + [deciding] + draw(st.lists(FRAME, max_size=3)), None, compress


# -- what must happen ----------------------------------------------------------------------------------------

def expected_end(stage: str, frames: list) -> tuple[str, set[int] | None]:
    """("close", codes): the sidecar closes with one of ``codes``; ("ends", None): the client closed first,
    any ending will do; ("goes on", None): the connection stays open (after the handshake only)."""
    for frame in frames:
        kind = frame[0]
        if kind in ("ping", "pong"):
            continue  # answered (or taken) by aiohttp itself
        if kind == "close":
            return "ends", None
        if kind == "bad":
            return "close", {frame[3]}
        size = len(frame[1].encode() if kind == "text" else frame[1])
        if size > MAX_MESSAGE_BYTES:
            return "close", {1009}
        if stage != "registered":  # the hello or the proof: anything else refused (docs/api.md)
            return "close", {CLOSE_REFUSED}
    return "goes on", None


def refusal_reason_ok(stage: str, frame, reason: str) -> bool:
    """The close reason names the problem: a bad hello (or the two versions), or the proof."""
    if frame[0] != "text":
        return True
    if stage == "hello":
        return reason.startswith("bad hello") or "speaks protocol" in reason
    return "proof" in reason


def tracebacks_through_sidecar(records) -> list[str]:
    found = []
    for record in records:
        if record.levelno < logging.ERROR or not record.exc_info or record.exc_info[1] is None:
            continue
        frames = traceback.extract_tb(record.exc_info[2])
        if any(f.filename.startswith(SIDECAR_CODE) for f in frames):
            found.append(f"{record.name}: {record.getMessage()}\n"
                         + "".join(traceback.format_exception(*record.exc_info)))
    return found


def metric_families(exposition: str) -> set[str]:
    """The families a Prometheus exposition declares (``# TYPE name kind``)."""
    return {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}


# -- the sidecar ---------------------------------------------------------------------------------------------

class Channel:
    """The app on a loop of its own (hypothesis drives a plain function), with the probe token of
    tests/service/test_probe_channel.py so that its ``connect`` helper is a good probe here."""

    def __init__(self, trace_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.app = make_app(dataclasses.replace(service_settings(trace_dir), probe_token=TOKEN))
        self.client = self.loop.run_until_complete(self._client())
        self.steps = itertools.count(10 ** 12)  # each session's last heartbeat: a step count of its own
        self.families = self.loop.run_until_complete(self.metric_families())  # before any probe said anything

    async def metric_families(self) -> set[str]:
        async with self.client.get("/metrics") as resp:
            assert resp.status == 200, await resp.text()
            return metric_families(await resp.text())

    async def _client(self) -> TestClient:
        client = TestClient(JsonErrorsTestServer(self.app))
        await client.start_server()
        return client

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, SESSION_BOUND_S))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()

    # -- one session ---------------------------------------------------------------------------------------
    async def session(self, stage: str, frames, beat_extras: dict | None, compress: bool) -> None:
        if stage == "upgrade":
            await self.upgrade(*frames)
        else:
            await self.frames(stage, frames, beat_extras or {}, compress)
        await self.settled()

    async def frames(self, stage: str, frames: list, beat_extras: dict, compress: bool) -> None:
        what = f"{stage}{' (compressed)' if compress else ''}: {[_short(f) for f in frames]}"
        ws = await self.client.ws_connect(PROBE_WS_PATH, compress=15 if compress else 0, autoclose=True)
        try:
            if stage in ("proof", "registered"):
                nonce = auth.new_nonce()
                await ws.send_str(json.dumps(hello_json(nonce)))
                challenge = decode_from_sidecar((await ws.receive(timeout=SESSION_BOUND_S)).data)
                assert isinstance(challenge, Challenge), f"{what}: {challenge!r}"
                if stage == "registered":
                    await ws.send_str(json.dumps({"type": "proof", "proof": auth.probe_proof(TOKEN, challenge.nonce,
                                                                                             nonce)}))
            for frame in frames:
                try:
                    await _send(ws, frame)
                except (ConnectionError, ClientError):
                    break  # the sidecar closed already: the frames after a refusal go nowhere
            end, codes = expected_end(stage, frames)
            if end == "goes on":
                steps = next(self.steps)
                await ws.send_str(json.dumps({"type": "heartbeat", "steps": steps, **beat_extras}))
                await self.heartbeat_seen(ws, steps, what)
                await self.reads(what)
                await ws.close()
                return
            kind, code, reason = await _ending(ws)
            if end == "close":
                assert (kind, code) in {("close", c) for c in codes}, \
                    f"{what}: expected a close with {codes}, got {kind} {code} {reason!r}"
                if code == CLOSE_REFUSED:
                    deciding = next(f for f in frames if f[0] not in ("ping", "pong"))
                    assert refusal_reason_ok(stage, deciding, reason), f"{what}: the reason {reason!r}"
                    assert len(reason.encode()) <= 123, f"{what}: {reason!r}"
        finally:
            if not ws.closed:
                await ws.close()

    async def heartbeat_seen(self, ws, steps: int, what: str) -> None:
        """The connection went on: the heartbeat sent after the fuzzed frames is applied."""
        for _ in range(500):
            listed = (await (await self.client.get("/processes")).json())["processes"]
            if any(p["last_step"] == steps for p in listed):
                return
            ending = await _ending(ws, timeout=0.01)
            if ending[0] != "still open":
                break
        else:
            ending = "still open, the heartbeat never seen"
        raise AssertionError(f"{what}: the connection did not go on after frames the sidecar should drop "
                             f"(ended: {ending})")

    async def reads(self, what: str) -> None:
        """The routes that show what the probes said still answer, whatever this probe said."""
        problems = []
        for path in ("/processes", "/healthz", "/syncs/watch", "/metrics"):
            async with self.client.get(path) as resp:
                raw = await resp.read()
                try:
                    check_answer(f"GET {path}", resp.status, resp.content_type, raw)
                except AssertionError as exc:
                    problems.append(str(exc).splitlines()[0])
        if lost := self.families - metric_families(raw.decode()):
            problems.append(f"GET /metrics left out {sorted(lost)}")
        assert not problems, f"{what}, then: " + "; ".join(problems)

    async def upgrade(self, method: str, handshake: dict, browser: dict, raw_host: str | None) -> None:
        """The upgrade request as raw bytes (odd headers the HTTP client would not send, or would fix)."""
        own_host = f"{self.client.host}:{self.client.port}"
        headers, labels = resolve_browser_headers(browser, {}, own_host)
        headers.setdefault("Host", own_host)
        for name, value in handshake.items():
            if value is not None and name not in headers:
                headers[name] = value
        if raw_host is not None:
            headers["Host"] = raw_host
        what = f"{method} {PROBE_WS_PATH} {headers}"
        head = f"{method} {PROBE_WS_PATH} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        reader, writer = await asyncio.open_connection(self.client.host, self.client.port)
        try:
            writer.write(head.encode("utf-8", "surrogateescape"))
            await writer.drain()
            status_line, _, rest = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").partition("\r\n")
            status = int(status_line.split()[1])
            lines = (line.partition(":") for line in rest.split("\r\n") if line)
            got = {name.strip().lower(): value.strip() for name, _, value in lines}
            if status == 101:
                assert method == "GET", what
                return  # the connection closes with no hello: the sidecar's handler ends quietly
            raw = b"" if method == "HEAD" else await reader.readexactly(int(got.get("content-length", "0")))
            content_type = got.get("content-type", "").split(";")[0]
            if method == "HEAD":
                assert status < 500, f"{what}: {status}"
            else:
                check_answer(what, status, content_type, raw)
            if raw_host is None and not parser_refuses(headers) and method != "HEAD":
                expected = guard_outcomes(method, PROBE_WS_PATH, headers, labels)
                assert guard_outcome(status, raw) in expected, f"{what}: {status} {raw[:300]!r}, expected {expected}"
        finally:
            writer.close()

    async def settled(self) -> None:
        """Every probe connection of the session is over on the sidecar's side: what it logs is logged."""
        for _ in range(1000):
            if not self.app[PROBE_SOCKETS] and not self.app[REGISTRY].all():
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError(f"a probe connection stays open on the sidecar: {self.app[PROBE_SOCKETS]}")
        for _ in range(3):
            await asyncio.sleep(0)


async def _send(ws, frame) -> None:
    kind = frame[0]
    if kind == "text":
        await ws.send_str(frame[1])
    elif kind == "binary":
        await ws.send_bytes(frame[1])
    elif kind == "ping":
        await ws.ping(frame[1])
    elif kind == "pong":
        await ws.pong(frame[1])
    elif kind == "close":
        await ws.send_frame(frame[1], WSMsgType.CLOSE)
    else:
        await ws.send_frame(frame[2], frame[1])


async def _ending(ws, timeout: float = SESSION_BOUND_S) -> tuple[str, int | None, str]:
    """How the sidecar ended the connection: ("close", code, reason) for a close frame, ("dropped", ...)
    for a connection cut without one; the challenge and clock probes before it are skipped."""
    while True:
        try:
            msg = await ws.receive(timeout=timeout)
        except asyncio.TimeoutError:
            return "still open", None, ""
        if msg.type == WSMsgType.TEXT:
            continue
        if msg.type == WSMsgType.CLOSE:
            return "close", msg.data, msg.extra or ""
        return "dropped", None, f"{msg.type.name} {msg.data!r} {ws.exception()!r}"


def _short(frame) -> str:
    text = repr(frame[1] if frame[0] != "bad" else frame[2])
    return f"{frame[0]}:{text[:80]}{'...' if len(text) > 80 else ''}({len(text)})"


@pytest.fixture
def channel(tmp_path):
    c = Channel(tmp_path / "traces")
    yield c
    c.close()


def still_serves_a_good_probe(channel: Channel) -> None:
    async def good():
        probe = await connect(channel.client, "worker", 0)
        [listed] = await processes(channel.client, 1)
        assert listed["role"] == "worker" and listed["rank"] == 0, listed
        healthz = await channel.client.get("/healthz")
        assert healthz.status == 200 and (await healthz.json())["processes"] == 1
        await probe.ws.close()

    channel.run(good())
    channel.run(channel.settled())


def no_unhandled(caplog, since: int = 0, *, collect: bool = False) -> None:
    if collect:
        gc.collect()  # an asyncio task's exception nobody retrieved is logged when the task is collected
    found = tracebacks_through_sidecar(caplog.records[since:])
    assert not found, "the sidecar logged exceptions it did not handle:\n" + "\n".join(found)


# -- the fuzz ------------------------------------------------------------------------------------------------

EXAMPLES = 400


def test_no_probe_channel_input_crashes_the_sidecar(channel, caplog):
    caplog.set_level(logging.WARNING)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(sessions())
    def fuzz(session):
        before = len(caplog.records)
        channel.run(channel.session(*session))
        no_unhandled(caplog, before)

    fuzz()
    still_serves_a_good_probe(channel)
    no_unhandled(caplog, collect=True)


def sweep() -> list[tuple[str, list, dict | None]]:
    """Each listed bad input once, at each point of a connection where it means something."""
    anywhere = [("text", t) for t in GARBAGE + DEEP_FRAMES] + BINARY + BAD_FRAMES + CLOSES + TOO_BIG_FRAMES \
        + [("text", json.dumps(t)) for t in TEMPLATES]
    cases = [("hello", [("text", h)], None) for h in BAD_HELLOS]
    cases += [("hello", [f], None) for f in anywhere]
    cases += [("proof", [f], None) for f in anywhere]
    cases += [("proof", [("text", json.dumps({"type": "proof", "proof": p}))], None)
              for p in ("", "0" * 63, "0" * 64, "G" * 64, None, 5, [], "0" * 64 + "\n")]
    cases += [("registered", [f], None) for f in anywhere + [("text", json.dumps(hello_json()))]]
    cases += [("registered", [("text", json.dumps({"type": "heartbeat", "steps": 1}))], {"sync_watch": w})
              for w in ({"sites": [1]}, {"sites": "abc"}, {"sites": [{"count": "x"}]}, {"sites": [{}]})]
    # A refusal, then frames pipelined behind it.
    cases += [("hello", [("text", "nope"), f, ("text", json.dumps(hello_json()))], None) for f in anywhere[::3]]
    # The upgrade: each handshake header odd in turn, other methods, a Host the parser refuses, a browser's.
    valid = {name: values[0] for name, values in UPGRADE_HEADERS.items()}
    cases += [("upgrade", ("GET", {**valid, name: value}, {}, None), None)
              for name, values in UPGRADE_HEADERS.items() for value in values[1:]]
    cases += [("upgrade", (method, valid, {}, None), None) for method in ("GET", "POST", "HEAD", "OPTIONS", "DELETE")]
    cases += [("upgrade", ("GET", valid, {}, host), None) for host in RAW_HOSTS]
    cases += [("upgrade", ("GET", valid, {name: value}, None), None)
              for name in ("Host", "Origin", "Sec-Fetch-Site") for value in BROWSER_VALUES[name]]
    return cases


def test_every_listed_bad_input_at_every_point_of_a_connection(channel, caplog):
    """The sweep the random fuzz may miss; every failure is collected, so that one does not hide another."""
    caplog.set_level(logging.WARNING)
    failures = []
    cases = sweep()
    for stage, frames, extras in cases:
        before = len(caplog.records)
        try:
            channel.run(channel.session(stage, frames, extras, False))
            no_unhandled(caplog, before)
        except (AssertionError, asyncio.TimeoutError) as exc:
            shown = repr(frames)[:300] if stage == "upgrade" else [_short(f) for f in frames]
            failures.append(f"{stage} {shown}: {type(exc).__name__}: {str(exc)[:3000]}")
    assert len(cases) > 400
    assert not failures, f"{len(failures)} of {len(cases)} inputs:\n\n" + "\n\n".join(failures)
    still_serves_a_good_probe(channel)
    no_unhandled(caplog, collect=True)


# -- what the fuzz found: each on its own --------------------------------------------------------------------

def ending_of(channel: Channel, stage: str, frame) -> tuple[str, int | None, str]:
    """How the sidecar ends a connection whose first frame (``stage`` "hello"), or whose first frame after a
    good hello ("proof"), is ``frame``."""
    async def go():
        ws = await channel.client.ws_connect(PROBE_WS_PATH, compress=0)
        if stage == "proof":
            await ws.send_str(json.dumps(hello_json(auth.new_nonce())))
            assert isinstance(decode_from_sidecar((await ws.receive(timeout=SESSION_BOUND_S)).data), Challenge)
        await _send(ws, frame)
        ending = await _ending(ws)
        if not ws.closed:
            await ws.close()
        await channel.settled()
        return ending

    return channel.run(go())


def goes_on_after(channel: Channel, frame, **beat) -> None:
    """A good probe sends ``frame``, then a heartbeat: the heartbeat is applied (the frame was dropped, the
    connection went on); then the routes that show what probes said answer without a 5xx."""
    async def go():
        probe = await connect(channel.client, "worker", 0)
        await processes(channel.client, 1)
        await _send(probe.ws, frame)
        await probe.ws.send_str(json.dumps({"type": "heartbeat", "steps": 7, **beat}))
        await channel.heartbeat_seen(probe.ws, 7, f"after {_short(frame)}")
        await channel.reads(f"after {_short(frame)} and a heartbeat with {beat}")
        await probe.ws.close()
        await channel.settled()

    channel.run(go())


@pytest.mark.parametrize("stage, frame", [
    ("hello", '{"type": "hello", "protocol": %s}' % _deep()),  # read before anything else: its version
    ("hello", json.dumps(hello_json())[:-1] + ', "unknown": %s}' % _deep()),
    ("proof", '{"type": "proof", "unknown": %s, "proof": "%s"}' % (_deep(), "0" * 64)),
], ids=["hello-protocol", "hello-unknown-field", "proof-unknown-field"])
def test_json_nested_deeper_than_the_parser_goes_is_refused_in_the_handshake(channel, caplog, stage, frame):
    """10 KB of brackets, from anyone who can connect (no token needed): msgspec raises RecursionError, which
    nothing in probe_channel.py catches (only ProtocolError): aiohttp logs 'Error handling request' with the
    traceback and drops the connection without a close frame, where docs/api.md says 4400 and the reason."""
    caplog.set_level(logging.WARNING)
    kind, code, reason = ending_of(channel, stage, ("text", frame))
    no_unhandled(caplog, collect=True)
    assert (kind, code) == ("close", CLOSE_REFUSED), (kind, code, reason)
    still_serves_a_good_probe(channel)


@pytest.mark.parametrize("frame", [
    '{"type": "heartbeat", "steps": 1, "stuck": {"a": %s}}' % _deep(),
    '{"type": "heartbeat", "steps": 1, "sync_watch": %s}' % ('{"a":' * DEEP + "1" + "}" * DEEP),
    '{"type": "answer", "query_id": 1, "kind": "stacks", "data": {"a": %s}}' % _deep(),
    '{"type": "clock_reply", "seq": 1, "probe_ns": 1, "unknown": %s}' % _deep(),
], ids=["heartbeat-stuck", "heartbeat-sync-watch", "answer-data", "unknown-field"])
def test_json_nested_deeper_than_the_parser_goes_is_dropped_after_the_handshake(channel, caplog, frame):
    """The same RecursionError after the handshake ends the probe's connection (it is unregistered, its
    jobs lose it) where a malformed frame is to be "logged and dropped, and the connection goes on"."""
    caplog.set_level(logging.WARNING)
    goes_on_after(channel, ("text", frame))
    no_unhandled(caplog, collect=True)


@pytest.mark.parametrize("stage", ["hello", "proof"])
def test_a_binary_frame_in_the_handshake_is_refused_with_4400(channel, caplog, stage):
    """A binary frame in place of the hello (or of the proof) is closed with 1000, "normal closure", no
    reason and nothing logged (the proof's: an info line that the probe "left before its proof"), where
    docs/api.md and probe_channel.py say any other frame is refused with 4400, the reason, and a warning."""
    caplog.set_level(logging.WARNING)
    kind, code, reason = ending_of(channel, stage, ("binary", json.dumps(hello_json()).encode()))
    assert (kind, code) == ("close", CLOSE_REFUSED), (kind, code, reason)
    assert reason, "the reason says why"
    assert any("refused" in r.getMessage() for r in caplog.records if r.name.endswith("probe_channel")), \
        [r.getMessage() for r in caplog.records]


def test_a_binary_frame_after_the_handshake_is_dropped_and_the_connection_goes_on(channel, caplog):
    """After the handshake a binary frame ends the connection (close 1000: ``_serve`` breaks on any frame
    that is not text), where docs/api.md says a malformed frame is logged and dropped and the connection
    goes on; the probe is unregistered and a capture running loses it."""
    caplog.set_level(logging.WARNING)
    goes_on_after(channel, ("binary", b"\x00"))


@pytest.mark.parametrize("sync_watch", [{"sites": [1]}, {"sites": "abc"}, {"sites": None}, {"sites": [{}]},
                                        {"sites": [{"count": "x"}]}, {"sites": [{"path": None, "line": [], "count": 1}]}])
def test_a_sync_watch_of_the_wrong_shape_leaves_the_routes_answering(channel, caplog, sync_watch):
    """A heartbeat's ``sync_watch`` is any JSON object (protocol.py: ``dict[str, Any]``) and is kept as it
    came: ``GET /syncs/watch`` then fails with a 500 (sidecar/syncs/report.py ``site_key``: TypeError or
    KeyError), and ``GET /metrics`` leaves out every family collected after the sync watch's
    (``WatchCollector.collect``: AttributeError), among them sidecar_engine_step_stuck,
    sidecar_requests_in_flight and sidecar_trigger_firings_total, for as long as that probe is connected."""
    caplog.set_level(logging.WARNING)
    goes_on_after(channel, ("ping", b""), sync_watch=sync_watch)
    no_unhandled(caplog, collect=True)
