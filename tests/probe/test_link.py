"""The probe's link against a stand-in sidecar (an aiohttp websocket server in the test's loop that
knows the token and does the handshake): the hello, typed frames both ways, malformed frames
dropped, a version refusal logged."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading

import pytest
from aiohttp import web

from sidecar.common import auth
from sidecar.engine import GENERIC
from sidecar.probe.link import CLOSE_REFUSED, SidecarLink
from sidecar.common.protocol import (
    PROBE_WS_PATH,
    Begin,
    Challenge,
    Heartbeat,
    Proof,
    Stop,
)
from sidecar.common.protocol_codec import PROTOCOL_VERSION, decode_from_probe, decode_hello, encode

PROCESS = GENERIC.identity("worker", 0, pid=os.getpid(), host="test")
TOKEN = "link-token"


class StandIn:
    """A sidecar that runs ``script(ws)`` on each probe connection and keeps the frames it got."""

    def __init__(self, script):
        self.script = script
        self.frames: list[str] = []
        self.connections = 0

    async def handshake(self, ws):
        """The sidecar's side: the hello, its challenge, the probe's proof checked."""
        hello = decode_hello(await self.receive(ws))
        assert hello.process == PROCESS
        nonce = auth.new_nonce()
        await ws.send_str(encode(Challenge(nonce=nonce, proof=auth.sidecar_proof(TOKEN, hello.nonce, nonce))))
        proof = decode_from_probe(await self.receive(ws))
        assert isinstance(proof, Proof) and auth.probe_proof_ok(TOKEN, nonce, hello.nonce, proof.proof)

    async def handle(self, request):
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.connections += 1
        await self.script(self, ws)
        return ws

    async def receive(self, ws):
        msg = await ws.receive(timeout=5)
        self.frames.append(msg.data)
        return msg.data


@pytest.fixture
async def serve():
    runners = []

    async def start(script):
        stand_in = StandIn(script)
        app = web.Application()
        app.router.add_get(PROBE_WS_PATH, stand_in.handle)
        runner = web.AppRunner(app, shutdown_timeout=1.0)  # a link closed mid-connection is not waited for
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]
        return stand_in, f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def make_link(endpoint, received, heartbeat=lambda: Heartbeat(steps=7)):
    got = threading.Event()

    def on_message(msg):
        received.append(msg)
        got.set()

    link = SidecarLink(endpoint, PROCESS, on_message=on_message, on_disconnect=lambda: None,
                       heartbeat=heartbeat, token_provider=lambda: TOKEN)
    return link, got


async def wait_for(event: threading.Event, timeout=10.0) -> bool:
    return await asyncio.to_thread(event.wait, timeout)


async def test_hello_first_then_typed_frames_and_malformed_ones_dropped(serve, caplog):
    async def script(stand_in, ws):
        await stand_in.handshake(ws)
        await ws.send_str("not json")
        await ws.send_str('{"type": "arm", "spec": {"id": "c1", "steps": 0}}')  # steps >= 1
        await ws.send_str('{"type": "begin", "job_id": "c1"}')  # no start_step
        await ws.send_str('{"type": "launch", "job_id": "c1"}')  # no such message
        await ws.send_str(encode(Begin(job_id="c1", start_step=12)))
        await ws.send_str(encode(Stop(job_id="c1", reason="timeout")))
        await stand_in.receive(ws)  # the probe's own frame (below)
        await ws.close()

    stand_in, endpoint = await serve(script)
    received = []
    link, _ = make_link(endpoint, received)
    with caplog.at_level(logging.WARNING, logger="sidecar.probe.link"):
        link.start()
        try:
            assert await wait_for(link.connected)
            for _ in range(100):
                if len(received) == 2:
                    break
                await asyncio.sleep(0.05)
            link.send(Stop(job_id="c1", reason="echo"))  # any struct goes out as its JSON
            for _ in range(100):
                if len(stand_in.frames) == 3:
                    break
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(link.close)
    assert received == [Begin(job_id="c1", start_step=12), Stop(job_id="c1", reason="timeout")]
    dropped = [r for r in caplog.records if "malformed message from the sidecar dropped" in r.getMessage()]
    assert len(dropped) == 4
    assert stand_in.frames[2] == encode(Stop(job_id="c1", reason="echo"))


async def test_heartbeats_are_typed_frames(serve, monkeypatch):
    monkeypatch.setattr("sidecar.probe.link.HEARTBEAT_S", 0.05)

    async def script(stand_in, ws):
        await stand_in.handshake(ws)
        await stand_in.receive(ws)
        await ws.close()

    stand_in, endpoint = await serve(script)
    link, _ = make_link(endpoint, [])
    link.start()
    try:
        for _ in range(100):
            if len(stand_in.frames) >= 3:
                break
            await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(link.close)
    assert decode_from_probe(stand_in.frames[2]) == Heartbeat(steps=7)


async def test_a_version_refusal_is_logged_once_with_the_sidecars_words(serve, caplog):
    words = "probe speaks protocol version 1, this sidecar speaks 2"

    async def script(stand_in, ws):
        await stand_in.receive(ws)
        await ws.close(code=CLOSE_REFUSED, message=words.encode())

    stand_in, endpoint = await serve(script)
    link, _ = make_link(endpoint, [])
    with caplog.at_level(logging.DEBUG, logger="sidecar.probe.link"):
        link.start()
        try:
            for _ in range(100):
                if stand_in.connections >= 3:  # refused, reconnected, refused again
                    break
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(link.close)
    said = [r for r in caplog.records if words in r.getMessage()]
    assert stand_in.connections >= 2 and len(said) >= 2
    assert [r.levelno for r in said if r.levelno >= logging.WARNING] == [logging.WARNING]  # once


async def test_an_ordinary_close_is_not_a_version_refusal(serve, caplog):
    async def script(stand_in, ws):
        await stand_in.handshake(ws)
        await ws.close(code=1001, message=b"going away")

    stand_in, endpoint = await serve(script)
    link, _ = make_link(endpoint, [])
    with caplog.at_level(logging.WARNING, logger="sidecar.probe.link"):
        link.start()
        try:
            for _ in range(100):
                if stand_in.connections >= 1 and not link.connected.is_set():
                    break
                await asyncio.sleep(0.05)
        finally:
            await asyncio.to_thread(link.close)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_against_the_real_sidecar_a_probe_of_another_version_is_told_both_versions(real_sidecar, caplog):
    link = SidecarLink(real_sidecar.url, PROCESS, on_message=lambda m: None, on_disconnect=lambda: None,
                       heartbeat=lambda: Heartbeat(steps=0), token_provider=lambda: real_sidecar.probe_token,
                       protocol=PROTOCOL_VERSION - 1)
    try:
        with caplog.at_level(logging.WARNING, logger="sidecar.probe.link"):
            link.start()
            for _ in range(100):
                if any(r.name == "sidecar.probe.link" for r in caplog.records):
                    break
                await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(link.close)
    [said] = [r.getMessage() for r in caplog.records if r.name == "sidecar.probe.link"]
    reason = said.split("refused this probe:")[1]
    assert {str(PROTOCOL_VERSION - 1), str(PROTOCOL_VERSION)} <= set(re.findall(r"\d+", reason)), said
