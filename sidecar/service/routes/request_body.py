"""The parameters in a start request's body: a JSON object, else a ``ParamError`` on ``body``.

However a body is wrong, it is the client's error and gets a 400 naming it (docs/api.md), never a 500:
bytes that are not text in the declared charset (UTF-8 when none is given), a charset Python has no
text codec for, JSON nested deeper than the parser goes, a ``Content-Encoding`` the body does not have.
Another media type is refused (415), not ignored. A form, multipart or text/plain body never gets here:
it is what a page on another site can make a browser send, and sidecar/service/browser_guard.py refuses it (403).

``json_body`` reads a body that is one JSON value of any kind (a trigger's rule, Alertmanager's
notification) the same way, optionally bounded in bytes other than the app's ``client_max_size``
(413 beyond it, before the rest is read).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ..jobs.params import ParamError

JSON = "application/json"


async def body_params(request: web.Request) -> dict[str, str]:
    if request.content_type != JSON:
        raise web.HTTPUnsupportedMediaType(
            text=f"send parameters in the query string or as a JSON object ({JSON}), not {request.content_type}")
    return _json_params(_decode(await _read(request), request.charset or "utf-8"))


async def json_body(request: web.Request, what: str, *, max_bytes: int | None = None) -> Any:
    """The body, one JSON value (``what`` it should be: the 415's message); ``max_bytes``: the most it
    may hold (None: the app's ``client_max_size``)."""
    if request.content_type != JSON:
        raise web.HTTPUnsupportedMediaType(text=f"send {what} as JSON ({JSON}), not {request.content_type}")
    return _json(_decode(await _read(request, max_bytes), request.charset or "utf-8"))


async def _read(request: web.Request, max_bytes: int | None = None) -> bytes:
    try:
        return await request.read() if max_bytes is None else await _read_at_most(request, max_bytes)
    except web.RequestPayloadError as exc:
        # The transfer decoding failed: a Content-Encoding the body does not have, a broken chunk.
        raise ParamError("body", f"could not be read: {exc.__cause__ or exc}") from None


async def _read_at_most(request: web.Request, max_bytes: int) -> bytes:
    length = request.content_length
    if length is not None and length > max_bytes:
        raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=length)
    chunks, total = [], 0
    while chunk := await request.content.read(1 << 16):
        total += len(chunk)
        if total > max_bytes:  # a chunked or compressed body: counted as it is decoded
            raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=total)
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(raw: bytes, charset: str) -> str:
    try:
        return raw.decode(charset)
    except LookupError:  # no such codec, or one that is not bytes to text (rot13, base64)
        raise ParamError("body", f"has charset {charset!r}, which is no text encoding known here; send UTF-8") from None
    except ValueError as exc:  # UnicodeError
        raise ParamError("body", f"is not valid {charset.upper()} text: {exc}") from None


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise ParamError("body", "invalid JSON: nested too deep") from None
    except ValueError as exc:  # JSONDecodeError; also an integer over int()'s digit limit
        raise ParamError("body", f"invalid JSON: {exc}") from None


def _json_params(text: str) -> dict[str, str]:
    body = _json(text)
    if not isinstance(body, dict):
        raise ParamError("body", "must be a JSON object")
    return {name: _scalar(name, value) for name, value in body.items()}


def _scalar(name: str, value: Any) -> str:
    """A JSON value as the text a query string would carry: ``true``, ``5``, ``2.5``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    kind = "null" if value is None else "an array" if isinstance(value, list) else "an object"
    raise ParamError(name, f"must be a string, number or boolean, got {kind}")
