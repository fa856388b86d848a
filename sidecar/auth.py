"""The shared secret between the sidecar, its HTTP clients and the probes."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

from . import config


def read_token() -> str | None:
    """The token a probe presents: $SIDECAR_TOKEN, else the token file the sidecar wrote."""
    value = os.environ.get(config.ENV_TOKEN, "").strip()
    if value:
        return value
    try:
        return config.token_file().read_text().strip() or None
    except OSError:
        return None


def ensure_token_file(path: Path, token: str | None) -> str:
    """Make sure ``path`` holds the sidecar's token (creating a random one if none is given).

    An existing file is reused so that a restarted sidecar keeps the secret its probes already know.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if token is None:
        try:
            existing = path.read_text().strip()
        except OSError:
            existing = ""
        token = existing or secrets.token_urlsafe(32)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token)
    os.replace(tmp, path)
    return token


def bearer_matches(header: str | None, token: str) -> bool:
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), token.encode())
