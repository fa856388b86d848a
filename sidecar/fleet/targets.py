"""A fleet's targets: each a sidecar's base URL (``scheme://host:port``) and the name it was found by
(a pod, a Prometheus instance), from a list, a file, or discovery; and the token for each.

Every discovery form ends here, so one target is written one way whoever found it, and the tokens
file can name it the same way. A token is never part of a message: errors name the key, not the value.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

MAX_TARGETS = 2000  # a selector that matches more is a mistake: say so rather than open that many sockets


class TargetError(ValueError):
    """A target list, file, discovery answer or tokens file that cannot be used: one line for the user."""


@dataclass(frozen=True)
class Target:
    url: str  # scheme://host:port, no path, no trailing slash
    name: str = ""  # how discovery named it (a pod, an instance label); "" when given as a URL


def base_url(text: str, default_port: int | None = None, scheme: str = "http") -> str:
    """``scheme://host:port`` of ``text`` (a URL, or ``host:port``); its path, query and user info are
    dropped. ``TargetError`` for anything else."""
    raw = text.strip()
    if "://" not in raw:
        raw = f"{scheme}://{raw}"
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:  # a port that is no number, a bad IPv6 literal
        raise TargetError(f"{text!r} is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetError(f"{text!r} is not an http(s) URL with a host")
    port = port or default_port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def unique(targets: list[Target]) -> list[Target]:
    """Each URL once (the first name wins), in order; ``TargetError`` past ``MAX_TARGETS``."""
    seen: dict[str, Target] = {}
    for t in targets:
        seen.setdefault(t.url, t)
    if len(seen) > MAX_TARGETS:
        raise TargetError(f"{len(seen)} targets, more than {MAX_TARGETS}: narrow the selection")
    return list(seen.values())


def from_list(text: str, default_port: int | None = None) -> list[Target]:
    """``--targets URL,URL``: comma-separated."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise TargetError("--targets: no URL given")
    return unique([Target(base_url(item, default_port)) for item in items])


def from_file(path: Path, default_port: int | None = None) -> list[Target]:
    """``--targets-file FILE``: one URL per line; blank lines and ``#`` comments ignored."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TargetError(f"cannot read the targets file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    targets = []
    for n, line in enumerate(lines, 1):
        item = line.split("#", 1)[0].strip()
        if item:
            try:
                targets.append(Target(base_url(item, default_port)))
            except TargetError as exc:
                raise TargetError(f"{path}:{n}: {exc}") from None
    if not targets:
        raise TargetError(f"the targets file {path} lists no URL")
    return unique(targets)


@dataclass(frozen=True)
class Tokens:
    """The tokens file: a JSON object whose keys are a target's URL (``http://10.0.0.7:8787``), its
    ``host:port``, its host alone, or ``"*"`` (every other target), and whose values are tokens. The
    most specific key wins; a target no key names gets ``default`` (``--token-file`` or
    ``$SIDECAR_TOKEN``), else no token."""

    by_key: tuple[tuple[str, str], ...] = ()
    default: str | None = None

    def for_target(self, target: Target) -> str | None:
        keys = dict(self.by_key)
        parts = urlsplit(target.url)
        host = parts.hostname or ""
        host_text = f"[{host}]" if ":" in host else host
        for key in (target.url, f"{host_text}:{parts.port}", host_text, host, "*"):
            if key in keys:
                return keys[key]
        return self.default


def read_tokens(path: Path, default: str | None = None) -> tuple[Tokens, str | None]:
    """The tokens file at ``path`` and a warning (a file other users can read), or ``TargetError``."""
    try:
        mode = path.stat().st_mode
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TargetError(f"cannot read the tokens file {path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        # The message of a JSON error may quote the text around the fault: a token. Only the place.
        where = f" (line {exc.lineno}, column {exc.colno})" if hasattr(exc, "lineno") else ""
        raise TargetError(f"the tokens file {path} is not JSON{where}") from None
    if not isinstance(data, dict):
        raise TargetError(f"the tokens file {path} must hold one JSON object: {{\"<target URL>\": \"<token>\", \"*\": ...}}")
    pairs = []
    for key, value in data.items():
        if not isinstance(value, str) or not value.strip():
            raise TargetError(f"the tokens file {path}: the value of {key!r} must be a non-empty string")
        pairs.append((_token_key(key, path), value.strip()))
    warning = None
    if os.name == "posix" and mode & (stat.S_IRGRP | stat.S_IROTH):
        warning = f"the tokens file {path} can be read by other users (chmod 600 it)"
    return Tokens(tuple(pairs), default), warning


def _token_key(key: str, path: Path) -> str:
    """A key as ``Tokens.for_target`` looks it up: a URL becomes its ``scheme://host:port``."""
    if key == "*" or "://" not in key:
        return key.strip()
    try:
        return base_url(key)
    except TargetError as exc:
        raise TargetError(f"the tokens file {path}: key {exc}") from None
