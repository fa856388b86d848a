"""Serving the app on a socket with every answer in JSON, even those aiohttp gives before the app runs.

aiohttp's HTTP parser refuses some requests itself (an unknown method, a request line or header over
8190 bytes, a malformed header, TLS sent to this plain-HTTP port) and answers them in plain text before
any middleware or view runs. The one place that answer is made is the connection's protocol,
``web.RequestHandler.handle_error``; aiohttp has no public setting for it (aio-libs/aiohttp#3287), so
``JsonErrorsRunner`` is a ``web.AppRunner`` whose server makes connections of a ``RequestHandler``
subclass. ``serve`` is ``web.run_app`` with that runner. An aiohttp test client (``aiohttp_client``)
runs the app without it: parser errors there are aiohttp's own.

``serve`` listens on several addresses on one port (``bind``): a loopback sidecar holds both 127.0.0.1
and ::1, so that no other process can take the address that ``localhost`` resolves to first.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from typing import Any, Callable, Collection, Sequence

from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError

from .routes.responses import error_code, json_error


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


# Binding an address this machine does not have: no IPv6 at all (EAFNOSUPPORT), or none configured
# on loopback (EADDRNOTAVAIL). Any other failure (EADDRINUSE above all) is another process's doing.
ABSENT_ADDRESS = (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
PORT_0_TRIES = 5  # port=0: a companion address whose port another process holds by chance gets a fresh port


class BindError(OSError):
    """Listening on ``host``:``port`` failed; ``errno`` and ``strerror`` are the socket's."""

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        # asyncio's own strerror repeats the address as a tuple: the errno's text is enough.
        why = os.strerror(cause.errno) if cause.errno else str(cause)
        super().__init__(cause.errno, f"cannot listen on {url_host(host)}:{port}: {why}")
        self.host, self.port = host, port

    def __str__(self) -> str:  # OSError's would begin with "[Errno 98]"
        return self.strerror


def url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


async def bind(runner: web.BaseRunner, hosts: Sequence[str], port: int, *,
               optional: Collection[str] = ()) -> tuple[list[Any], list[tuple[str, OSError]]]:
    """Listen on ``port`` of every one of ``hosts``, all on one port: with ``port=0`` the first picks a
    free one and the others take the same, so that a client reaches the sidecar at that port whichever
    address its name resolves to (should another process hold that port on a later address by chance,
    all start again on a fresh one). Returns the bound addresses and the hosts of ``optional`` left out
    because this machine has no such address (with the error). Anything else raises ``BindError``
    naming the address, with nothing left listening: a start that cannot hold every address it was
    asked for serves none of them."""
    attempt = 1
    while True:
        try:
            return await _bind_once(runner, hosts, port, optional)
        except BindError as exc:
            by_chance = port == 0 and exc.port != 0 and exc.errno == errno.EADDRINUSE
            if not by_chance or attempt == PORT_0_TRIES:
                raise
            attempt += 1


async def _bind_once(runner: web.BaseRunner, hosts: Sequence[str], port: int,
                     optional: Collection[str]) -> tuple[list[Any], list[tuple[str, OSError]]]:
    sites: list[web.TCPSite] = []
    left_out: list[tuple[str, OSError]] = []
    chosen = port
    try:
        for host in hosts:
            before = len(runner.addresses)
            site = web.TCPSite(runner, host, chosen)
            try:
                await site.start()
            except OSError as exc:
                await site.stop()  # registered with the runner before it failed to listen
                if host in optional and exc.errno in ABSENT_ADDRESS:
                    left_out.append((host, exc))
                    continue
                raise BindError(host, chosen, exc) from None
            sites.append(site)
            chosen = runner.addresses[before][1]
    except BaseException:
        for site in sites:
            await site.stop()
        raise
    return runner.addresses, left_out


def serve(app: web.Application, hosts: Sequence[str], port: int,
          listening: Callable[[Sequence[Any], Sequence[tuple[str, OSError]]], None] = lambda bound, left_out: None,
          *, optional: Collection[str] = ()) -> None:
    """Serve ``app`` on ``port`` of each of ``hosts`` (``bind``) until SIGINT or SIGTERM, as
    ``web.run_app(app, host=, port=, access_log=None)`` does; ``listening`` gets the bound addresses
    (``port=0`` picks a free one) and the ``optional`` hosts left out. ``BindError`` when an address
    cannot be held."""

    async def main() -> None:
        # run_app's defaults: a shorter keep-alive than a bare runner's, signals end the loop.
        runner = JsonErrorsRunner(app, handle_signals=True, access_log=None, keepalive_timeout=75.0)
        await runner.setup()
        try:
            bound, left_out = await bind(runner, hosts, port, optional=optional)
            listening(bound, left_out)
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    # SIGINT/SIGTERM raise GracefulExit out of the loop; asyncio.run then cancels main, which cleans up.
    with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):
        asyncio.run(main())
