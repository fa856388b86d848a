"""Pieces of the fault-injection tests on real vLLM (test_vllm_faults.py).

- ``Squatter``: a hostile server on the sidecar's port while the sidecar is down. It keeps every byte
  (through a ``Relay`` in front of it), every websocket frame decoded and every metric push, answers
  each probe's hello with a proof it cannot have made, and sends commands naming paths of its choosing.
- ``token_forms``: the token as it could leak: raw, hex, base64 (at every alignment).
- ``tree``: what a folder holds (paths, sizes, modification times), to compare before and after.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import socket
import time
from contextlib import suppress
from pathlib import Path

from aiohttp import WSMsgType, web

from relay import Relay
from sidecar.common.protocol import METRICS_PUSH_PATH, PROBE_WS_PATH


class Squatter:
    """Not a sidecar. ``targets``: folders outside the trace root that its commands name."""

    JOB_ID = "20990101-000000-5a7700"  # a well-formed capture id: only its paths are hostile

    def __init__(self, port: int, targets: list[Path]) -> None:
        self.port = port
        self.targets = targets
        self.headers: list[dict[str, str]] = []
        self.connections: list[list[str | bytes]] = []  # websocket frames received, per connection
        self.pushes: list[bytes] = []
        self._relay: Relay | None = None
        self._runner: web.AppRunner | None = None

    def commands(self, target: Path) -> list[dict]:
        job = self.JOB_ID
        return [
            {"type": "arm", "spec": {"id": job, "steps": 3, "out_dir": str(target), "dir": str(target),
                                     "trace": str(target / "trace.json")}},
            {"type": "sync_arm", "spec": {"id": "s" + job, "steps": 3, "out_dir": str(target)}},
            {"type": "begin", "job_id": job, "start_step": 0, "out_dir": str(target)},
            {"type": "arm", "spec": {"id": "..", "steps": 3}},
            {"type": "arm", "spec": {"id": str(target), "steps": 3}},
            {"type": "begin", "job_id": "..", "start_step": 0},
            {"type": "verdict", "job_id": job, "state": "done", "trace": str(target / "merged.json")},
        ]

    async def probe_ws(self, request: web.Request) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        frames: list[str | bytes] = []
        n = len(self.connections)
        self.connections.append(frames)
        try:
            first = await ws.receive(timeout=10)
        except asyncio.TimeoutError:
            return ws
        if first.type not in (WSMsgType.TEXT, WSMsgType.BINARY):
            return ws
        frames.append(first.data)
        challenge = {"type": "challenge", "nonce": secrets.token_hex(32), "proof": secrets.token_hex(32)}
        commands = self.commands(self.targets[n % len(self.targets)])
        # Every other connection: commands first, as if no handshake were needed, then the challenge.
        sequence = [challenge, *commands] if n % 2 == 0 else [*commands, challenge, *commands]
        for message in sequence:
            if ws.closed:
                break
            with suppress(ConnectionError, RuntimeError):
                await ws.send_str(json.dumps(message))
        deadline = time.monotonic() + 3.0
        while not ws.closed and time.monotonic() < deadline:
            try:
                msg = await ws.receive(timeout=max(0.05, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
            if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                frames.append(msg.data)
            elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
                break
        return ws

    async def push(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        self.pushes.append(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    async def start(self) -> "Squatter":
        app = web.Application()
        app.router.add_get(PROBE_WS_PATH, self.probe_ws)
        app.router.add_post(METRICS_PUSH_PATH, self.push)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        inner_port = site._server.sockets[0].getsockname()[1]
        self._relay = await Relay(self.port, inner_port).start()
        return self

    async def stop(self) -> None:
        if self._relay is not None:
            await self._relay.stop()
        if self._runner is not None:
            await self._runner.cleanup()

    def hellos(self) -> list[dict]:
        return [json.loads(frames[0]) for frames in self.connections if frames]

    def everything_received(self) -> bytes:
        """Raw bytes on the wire (client websocket frames are masked there), then each decoded frame,
        push body and header."""
        parts = [bytes(r) for r in (self._relay.received if self._relay else [])]
        parts += [f.encode() if isinstance(f, str) else f for c in self.connections for f in c]
        parts += self.pushes
        parts += [f"{k}: {v}".encode("utf-8", "surrogateescape") for h in self.headers for k, v in h.items()]
        return b"\n".join(parts)


def token_forms(token: str) -> list[bytes]:
    """The token, its hex (both cases) and its base64 (standard and URL-safe) as it would appear at
    any offset of a longer encoded text: for each alignment, only the characters no neighbour changes."""
    raw = token.encode()
    forms = [raw, raw.hex().encode(), raw.hex().upper().encode()]
    for shift in range(3):  # the token starts `shift` bytes into a 3-byte group
        data = b"\0" * shift + raw
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            # Whole groups of token bytes only: the first group holds a neighbour's bytes when shifted,
            # the last incomplete one the next neighbour's.
            forms.append(encode(data)[4 if shift else 0:len(data) // 3 * 4])
    return forms


def tree(root: Path) -> dict[str, tuple]:
    if not root.exists():
        return {}
    out = {}
    for path in root.rglob("*"):
        with suppress(FileNotFoundError):
            st = path.lstat()
            out[str(path.relative_to(root))] = ("dir",) if path.is_dir() else ("file", st.st_size, st.st_mtime_ns)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
