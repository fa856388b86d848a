"""The sidecar's side of the probe handshake, with a probe written here in raw JSON frames and the
HMAC inputs spelled out as docs/api.md gives them: the token never travels; the sidecar proves it
knows it first; a probe registers only after its own proof checks out."""

import asyncio
import hashlib
import hmac
import json
import logging
import secrets

import pytest
from aiohttp import WSMsgType

from sidecar.common.protocol import PROBE_WS_PATH
from sidecar.common.protocol_codec import PROTOCOL_VERSION

from service_fakes import identity

TOKEN = "probe-auth-token"


def mac(label: bytes, first: str, second: str, token: str = TOKEN) -> str:
    return hmac.new(token.encode(), label + b"\0" + first.encode() + b"\0" + second.encode(), hashlib.sha256).hexdigest()


@pytest.fixture
async def client(aiohttp_client, tmp_path):
    from sidecar.service.app import ServiceSettings, make_app

    settings = ServiceSettings(trace_dir=tmp_path / "traces", probe_token=TOKEN, http_token=None, max_steps=50,
                               max_capture_bytes=1 << 30, keep=20, stop_grace_s=1.0)
    return await aiohttp_client(make_app(settings))


def hello(nonce: str) -> str:
    ident = identity("worker", 0)
    process = {f: getattr(ident, f) for f in ("role", "role_label", "step_driven", "pid", "rank", "host", "cuda", "engine")}
    return json.dumps({"type": "hello", "protocol": PROTOCOL_VERSION, "process": process, "nonce": nonce})


async def registered(client) -> list:
    return (await (await client.get("/processes")).json())["processes"]


async def challenge(client, nonce: str):
    ws = await client.ws_connect(PROBE_WS_PATH)  # no Authorization header: none is needed
    await ws.send_str(hello(nonce))
    msg = await ws.receive(timeout=5)
    assert msg.type == WSMsgType.TEXT, msg
    return ws, json.loads(msg.data)


async def test_the_sidecar_proves_it_knows_the_token_and_the_probe_registers_after_its_proof(client):
    nonce = secrets.token_hex(32)
    ws, got = await challenge(client, nonce)
    assert set(got) == {"type", "nonce", "proof"} and got["type"] == "challenge"
    assert len(got["nonce"]) == 64 and got["nonce"] != nonce
    assert hmac.compare_digest(got["proof"], mac(b"sidecar", nonce, got["nonce"]))
    assert await registered(client) == [], "not before the probe's proof"
    await ws.send_str(json.dumps({"type": "proof", "proof": mac(b"probe", got["nonce"], nonce)}))
    for _ in range(100):
        if await registered(client):
            break
        await asyncio.sleep(0.02)
    assert len(await registered(client)) == 1
    await ws.close()


@pytest.mark.parametrize("answer", [
    "wrong",  # a proof made without the token
    "mirrored",  # the sidecar's own proof sent back: the labels differ by direction
    "other token",
    "report",  # anything but a proof
])
async def test_a_probe_without_a_valid_proof_is_refused_and_never_registered(client, caplog, answer):
    nonce = secrets.token_hex(32)
    ws, got = await challenge(client, nonce)
    frames = {
        "wrong": json.dumps({"type": "proof", "proof": "0" * 64}),
        "mirrored": json.dumps({"type": "proof", "proof": got["proof"]}),
        "other token": json.dumps({"type": "proof", "proof": mac(b"probe", got["nonce"], nonce, token="guess")}),
        "report": json.dumps({"type": "capture", "job_id": "c1", "state": "armed", "steps_seen": 1}),
    }
    with caplog.at_level(logging.WARNING, logger="sidecar.service.routes.probe_channel"):
        await ws.send_str(frames[answer])
        msg = await ws.receive(timeout=5)
    assert msg.type == WSMsgType.CLOSE and msg.data == 4400, msg
    assert "proof" in msg.extra
    assert any("refused" in r.getMessage() for r in caplog.records)
    assert await registered(client) == []


async def test_a_recorded_proof_is_worth_nothing_on_the_next_connection(client):
    nonce = secrets.token_hex(32)
    ws, got = await challenge(client, nonce)
    old_proof = mac(b"probe", got["nonce"], nonce)
    await ws.close()
    ws, again = await challenge(client, nonce)  # the same probe nonce: a fresh sidecar nonce all the same
    assert again["nonce"] != got["nonce"]
    await ws.send_str(json.dumps({"type": "proof", "proof": old_proof}))
    msg = await ws.receive(timeout=5)
    assert msg.type == WSMsgType.CLOSE and msg.data == 4400
    assert await registered(client) == []


async def test_a_hello_without_a_nonce_is_refused(client):
    ws = await client.ws_connect(PROBE_WS_PATH)
    frame = json.loads(hello("0" * 64))
    del frame["nonce"]
    await ws.send_str(json.dumps(frame))
    msg = await ws.receive(timeout=5)
    assert msg.type == WSMsgType.CLOSE and msg.data == 4400 and msg.extra.startswith("bad hello")
