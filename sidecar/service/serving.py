"""Serving the app on a socket with every answer in JSON, even those aiohttp gives before the app runs.

aiohttp's HTTP parser refuses some requests itself (an unknown method, a request line or header over
8190 bytes, a malformed header, TLS sent to this plain-HTTP port) and answers them in plain text before
any middleware or view runs. The one place that answer is made is the connection's protocol,
``web.RequestHandler.handle_error``; aiohttp has no public setting for it (aio-libs/aiohttp#3287), so
``JsonErrorsRunner`` is a ``web.AppRunner`` whose server makes connections of a ``RequestHandler``
subclass. ``serve`` is ``web.run_app`` with that runner. An aiohttp test client (``aiohttp_client``)
runs the app without it: parser errors there are aiohttp's own.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable, Sequence

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError

from .responses import error_code, json_error


class JsonErrorsProtocol(web.RequestHandler):
    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        # aiohttp's own does the rest: it logs, and raises if a response already began on the connection.
        super().handle_error(request, status, exc, message)
        # The parser's message says what was wrong with the request; a 500's would tell the client about
        # the sidecar's insides (it is in the log).
        text = message if status < 500 and message else "the sidecar failed on this request; its log says why"
        if isinstance(exc, ContentEncodingError):  # its message can be just "deflate"
            text = f"the body does not decode as its Content-Encoding says: {message}"
        response = json_error(status, error_code(status), text)
        response.force_close()  # after a parser error the rest of the stream cannot be trusted
        return response


class _JsonErrorsServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        # web.Server.__call__, with the protocol class swapped (the attributes it passes are its own).
        return JsonErrorsProtocol(self, loop=self._loop, **self._kwargs)


class JsonErrorsRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _JsonErrorsServer(made.request_handler, request_factory=made.request_factory,
                                 handler_cancellation=made.handler_cancellation, loop=made._loop, **made._kwargs)


def serve(app: web.Application, host: str, port: int,
          listening: Callable[[Sequence[Any]], None] = lambda addresses: None) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, as ``web.run_app(app, host=, port=, access_log=None)`` does;
    ``listening`` gets the bound addresses (``port=0`` picks a free one)."""

    async def main() -> None:
        # run_app's defaults: a shorter keep-alive than a bare runner's, signals end the loop.
        runner = JsonErrorsRunner(app, handle_signals=True, access_log=None, keepalive_timeout=75.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            listening(runner.addresses)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    # SIGINT/SIGTERM raise GracefulExit out of the loop; asyncio.run then cancels main, which cleans up.
    with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
        asyncio.run(main())
