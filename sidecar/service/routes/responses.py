"""What every HTTP route may use: JSON errors, and the parameters of a start request."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Mapping

from aiohttp import hdrs, web
from multidict import CIMultiDict

from .request_body import JSON, body_params

__all__ = ["JSON", "error_code", "http_exception_json", "json_error", "start_params"]


def json_error(status: int, error: str, message: str, *, headers: Mapping[str, str] | None = None,
               **extra: Any) -> web.Response:
    return web.json_response({"error": error, "message": message, **extra}, status=status, headers=headers)


# 413's phrase differs between Python versions (3.13: "Content Too Large"); the metric push says too_large.
_CODES = {413: "too_large"}


def error_code(status: int) -> str:
    """The ``error`` of an answer that has no code of its own: its status's phrase, ``not_found``."""
    if status in _CODES:
        return _CODES[status]
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "error"
    return phrase.lower().replace(" ", "_").replace("-", "_")


def http_exception_json(exc: web.HTTPException) -> web.Response:
    """``exc`` (raised with ``text=`` or none) as a JSON error: same status, message and headers (Allow,
    Retry-After, ...) but its body's own."""
    headers = CIMultiDict(exc.headers)
    for name in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH):
        headers.popall(name, None)
    return json_error(exc.status, error_code(exc.status), _message(exc), headers=headers)


def _message(exc: web.HTTPException) -> str:
    bare = not exc.text or exc.text == f"{exc.status}: {exc.reason}"  # aiohttp's default text
    if bare and isinstance(exc, web.HTTPMethodNotAllowed):  # a known path, another method
        allowed = sorted(exc.allowed_methods)
        return f"{exc.method} is not allowed on this path; use {' or '.join(allowed)} (the Allow header)"
    return exc.text or exc.reason


async def start_params(request: web.Request) -> dict[str, str]:
    """Parameters of a start request: the query string, plus a form or JSON body on POST."""
    if request.method not in ("GET", "POST"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"])  # the message: _message
    params = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        params.update(await body_params(request))
    return params
