"""Pieces of the fault-injection tests on real vLLM (test_vllm_faults.py).

- ``LoopThread``: an asyncio loop on a daemon thread, for servers a synchronous test runs beside the
  background load.
- ``Relay``: a TCP listener that forwards each connection to another port and keeps every byte its
  clients sent (the recovery of an OTLP backend, and the squatter's raw record).
- ``Squatter``: a hostile server on the sidecar's port while the sidecar is down. It keeps every byte
  (through a ``Relay`` in front of it), every websocket frame decoded and every metric push, answers
  each probe's hello with a proof it cannot have made, and sends commands naming paths of its choosing.
- ``token_forms``: the token as it could leak: raw, hex, base64 (at every alignment).
- ``tree``: what a folder holds (paths, sizes, modification times), to compare before and after.
- ``SmallDisk``: a small tmpfs in a user + mount namespace of its own, for a stack whose disk fills up.
- ``ReusedStack``: one stack shared by tests in turn, the last of which ends it (conftest.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import shutil
import socket
import subprocess
import threading
import time
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Coroutine, Iterator

from aiohttp import WSMsgType, web

from sidecar.devtools.stack import Stack
from sidecar.protocol import METRICS_PUSH_PATH, PROBE_WS_PATH


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="fault-tools-loop", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self.loop.close()


class Relay:
    """127.0.0.1:``port`` forwarded to 127.0.0.1:``target_port``; ``received`` holds, per
    connection, every byte its client sent."""

    def __init__(self, port: int, target_port: int) -> None:
        self.port, self.target_port = port, target_port
        self.received: list[bytearray] = []
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, bind_timeout_s: float = 10.0) -> "Relay":
        deadline = time.monotonic() + bind_timeout_s
        while True:  # the port's last owner may still be letting it go
            try:
                self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port,
                                                          reuse_address=True)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            with suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        record = bytearray()
        self.received.append(record)
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        await asyncio.gather(self._pump(reader, up_writer, record), self._pump(up_reader, writer, None))
        self._writers.discard(writer)
        self._writers.discard(up_writer)

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bytearray | None) -> None:
        try:
            while data := await src.read(65536):
                if record is not None:
                    record.extend(data)
                dst.write(data)
                await dst.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with suppress(Exception):
                dst.close()


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


SMALL_DISK_MB = 24
SMALL_DISK_FLOOR_MB = 1  # the sidecar's --min-free-mb there: low, so that a capture can start with little room left


class SmallDisk:
    """A process holding a user + mount namespace in which ``folder`` is a tmpfs of ``mb`` MiB."""

    def __init__(self, folder: Path, mb: int) -> None:
        for tool in ("unshare", "nsenter"):
            assert shutil.which(tool), f"{tool} (util-linux) is needed to give the test a small disk"
        folder.mkdir(parents=True)
        self.folder = folder
        self._holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
             f"mount -t tmpfs -o size={mb}m tmpfs '{folder}' && echo mounted && exec sleep 100000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self._holder.stdout.readline().strip()
        if line != "mounted":
            self._holder.kill()
            raise RuntimeError(f"cannot mount a tmpfs in a user namespace here: {self._holder.stderr.read().strip()}")

    @property
    def launcher(self) -> tuple[str, ...]:
        """Runs a command inside the namespace, as the same user (uid 0 inside maps to it)."""
        return ("nsenter", "-t", str(self._holder.pid), "--user", "--mount", "--preserve-credentials", "--")

    def seen(self, path: Path) -> Path:
        """``path`` inside the namespace, as this process can reach it."""
        return Path(f"/proc/{self._holder.pid}/root") / path.relative_to("/")

    def used_bytes(self) -> int:
        st = os.statvfs(self.seen(self.folder))
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def free_bytes(self) -> int:
        st = os.statvfs(self.seen(self.folder))
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        self._holder.kill()
        self._holder.wait(timeout=10)


class ReusedStack:
    """A server start (40-70 s on a 2-core host) shared by tests that run one after the other, the last
    of which ends the stack (SIGTERM, a killed worker). ``make(resources)`` builds a stack, registering
    in ``resources`` what must be released after it (a small disk). ``use`` gives the stack serving: the
    one an earlier test left, else a new one, so each test also passes alone or in another order.
    ``warm`` starts it on a thread of its own ahead of its first ``use``: a start is mostly one core's
    work (each engine process imports and loads in turn), so two overlap on a 2-core host."""

    def __init__(self, make: Callable[[ExitStack], Stack]) -> None:
        self._make = make
        self._stack: Stack | None = None
        self._resources = ExitStack()
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    def warm(self) -> None:
        if self._stack is None and self._starting is None:
            self.close()
            self._starting = threading.Thread(target=self._start, name="stack-start", daemon=True)
            self._starting.start()

    def use(self) -> Stack:
        if self._starting is not None:  # a warm start: its outcome, once it has one
            self._starting.join()
            self._starting, error, self._start_error = None, self._start_error, None
            if error is not None:
                self.close()
                raise error
        stack = self._stack
        if stack is None or not all(p is not None and p.poll() is None for p in (stack._server, stack._sidecar)):
            self.close()
            try:
                stack = self._new()
                stack.start()
            except BaseException:
                self.close()
                raise
        return stack

    @contextmanager
    def use_up(self) -> Iterator[Stack]:
        """The stack for a test that ends it; closed after, and the next ``use`` starts a new one."""
        stack = self.use()
        resources, self._stack, self._resources = self._resources, None, ExitStack()
        with resources:
            yield stack

    def close(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        self._stack = None
        self._resources.close()

    def _new(self) -> Stack:
        """A new stack, not started, in place of a closed one."""
        self._resources = ExitStack()
        stack = self._make(self._resources)
        self._resources.callback(stack.close)
        self._stack = stack
        return stack

    def _start(self) -> None:
        try:
            self._new().start()
        except BaseException as exc:  # noqa: BLE001 (raised by the next use)
            self._start_error = exc
