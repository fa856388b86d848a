"""What every HTTP route may use: JSON errors, and the parameters of a start request."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from .params import ParamError


def json_error(status: int, error: str, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": error, "message": message, **extra}, status=status)


async def start_params(request: web.Request) -> dict[str, str]:
    """Parameters of a start request: the query string, plus a form or JSON body on POST."""
    if request.method not in ("GET", "POST"):
        raise web.HTTPMethodNotAllowed(request.method, ["GET", "POST"], text="use GET or POST")
    params = dict(request.query)
    if request.method == "POST" and request.can_read_body:
        params.update(await _body_params(request))
    return params


async def _body_params(request: web.Request) -> dict[str, str]:
    if request.content_type == "application/json":
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            raise ParamError("body", f"invalid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ParamError("body", "must be a JSON object")
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in body.items()}
    return {k: str(v) for k, v in (await request.post()).items()}
