"""Two pieces of tests that put a TCP port in front of a server (not a test module):

- ``LoopThread``: an asyncio loop on a daemon thread, for servers a synchronous test runs beside the
  background load.
- ``Relay``: a TCP listener that forwards each connection to another port and keeps every byte its
  clients sent (the recovery of an OTLP backend, the squatter's raw record, a second vLLM server's
  probes reaching the session sidecar only once its test begins: tests/parallel_server.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import suppress
from typing import Any, Coroutine


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
