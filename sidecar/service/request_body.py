"""The parameters in a start request's body: a form or a JSON object, else a ``ParamError`` on ``body``.

However a body is wrong, it is the client's error and gets a 400 naming it (docs/api.md), never a 500:
bytes that are not text in the declared charset (UTF-8 when none is given), a charset Python has no
text codec for, JSON nested deeper than the parser goes, a multipart body that does not parse, a
``Content-Encoding`` the body does not have. Another media type is refused (415), not ignored.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import web

from .params import ParamError

JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
MULTIPART = "multipart/form-data"
MAX_FIELDS = 100  # a start request has a dozen parameters; more is a mistake or an attack on parse_qsl


async def body_params(request: web.Request) -> dict[str, str]:
    content_type = request.content_type
    if content_type == MULTIPART:
        return await _multipart(request)
    if content_type not in (JSON, FORM):
        raise web.HTTPUnsupportedMediaType(
            text=f"send parameters in the query string, as a form ({FORM} or {MULTIPART}) or as a JSON object "
                 f"({JSON}), not {content_type}")
    charset = request.charset or "utf-8"
    text = _decode(await _read(request), charset)
    return _json_params(text) if content_type == JSON else _form_params(text, charset)


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.RequestPayloadError as exc:
        # The transfer decoding failed: a Content-Encoding the body does not have, a broken chunk.
        raise ParamError("body", f"could not be read: {exc.__cause__ or exc}") from None


def _decode(raw: bytes, charset: str) -> str:
    try:
        return raw.decode(charset)
    except LookupError:  # no such codec, or one that is not bytes to text (rot13, base64)
        raise ParamError("body", f"has charset {charset!r}, which is no text encoding known here; send UTF-8") from None
    except ValueError as exc:  # UnicodeError
        raise ParamError("body", f"is not valid {charset.upper()} text: {exc}") from None


def _json_params(text: str) -> dict[str, str]:
    try:
        body = json.loads(text)
    except RecursionError:
        raise ParamError("body", "invalid JSON: nested too deep") from None
    except ValueError as exc:  # JSONDecodeError; also an integer over int()'s digit limit
        raise ParamError("body", f"invalid JSON: {exc}") from None
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


def _form_params(text: str, charset: str) -> dict[str, str]:
    try:
        pairs = parse_qsl(text.rstrip(), keep_blank_values=True, encoding=charset, errors="strict",
                          max_num_fields=MAX_FIELDS)
    except ValueError as exc:  # a percent-escape that is no text in the charset; too many fields
        raise ParamError("body", f"is not a valid form in {charset.upper()}: {exc}") from None
    return dict(pairs)


async def _multipart(request: web.Request) -> dict[str, str]:
    try:
        form = await request.post()
    except web.HTTPException:
        raise  # over the size limit: its own status
    except Exception as exc:
        # aiohttp's multipart reader raises ValueError, RuntimeError, TypeError, LookupError or a payload
        # error on a malformed body, whichever its parser reached first: every one is the client's.
        raise ParamError("body", f"is not valid {MULTIPART}: {exc}") from None
    params = {}
    for name, value in form.items():
        if not isinstance(value, str):  # a file part, or a part of a non-text type (bytes)
            raise ParamError(name, "must be a plain text field, not a file or binary part")
        params[name] = value
    return params
