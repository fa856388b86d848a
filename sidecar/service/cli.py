"""``sidecar serve``: run the sidecar service beside an engine."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Sequence

from .. import auth, config


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="run the sidecar HTTP service beside an engine")
    p.add_argument("--host", default=config.DEFAULT_HOST, help="address to bind (default %(default)s)")
    p.add_argument("--port", type=int, default=config.DEFAULT_PORT, help="port (default %(default)s)")
    shared = os.environ.get(config.ENV_TRACE_DIR, "").strip()
    p.add_argument("--trace-dir", type=Path, default=Path(shared or "traces"),
                   help=f"where captures are written (default ${config.ENV_TRACE_DIR} when set, the engine's probes "
                        "write under it too; else ./traces)")
    p.add_argument("--token", default=None,
                   help=f"bearer token for the HTTP API and probes, at least {auth.MIN_TOKEN_CHARS} visible ASCII "
                        f"characters; required when --host is not loopback. Every user of the host sees a "
                        f"command line in ps: prefer ${config.ENV_TOKEN} in the environment")
    p.add_argument("--max-steps", type=int, default=config.DEFAULT_MAX_STEPS, help="largest steps= accepted (default %(default)s)")
    p.add_argument("--max-capture-mb", type=int, default=config.DEFAULT_MAX_CAPTURE_MB, help="size limit of one capture's traces (default %(default)s MiB)")
    p.add_argument("--keep", type=int, default=config.DEFAULT_KEEP_CAPTURES, help="finished captures kept on disk (default %(default)s)")
    p.add_argument("--keep-mb", type=int, default=config.DEFAULT_KEEP_MB,
                   help="MiB of finished captures kept on disk: the oldest go first, the newest always stays "
                        "(default %(default)s)")
    p.add_argument("--min-free-mb", type=int, default=config.DEFAULT_MIN_FREE_MB,
                   help="refuse a capture (HTTP 507) while the trace dir's disk has less free (default %(default)s MiB)")
    p.add_argument("--triggers", type=Path, default=None, metavar="FILE",
                   help="trigger rules to install at start: a JSON list (docs/api.md, Triggers)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(handler=_serve)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _token(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The HTTP token (--token, else $SIDECAR_TOKEN, else none) and what is wrong with it, if anything."""
    if args.token:
        # /proc/<pid>/cmdline is readable by every user; /proc/<pid>/environ only by the same one.
        print(f"sidecar serve: warning: --token is visible to every user of this host (ps); "
              f"set ${config.ENV_TOKEN} in the environment instead", file=sys.stderr)
    source = "--token" if args.token else f"${config.ENV_TOKEN}"
    token = (args.token or os.environ.get(config.ENV_TOKEN, "")).strip() or None
    problem = auth.token_problem(token) if token else None
    return token, f"{source}: {problem}" if problem else None


def _listening(trace_dir: Path) -> Callable[[Sequence[tuple]], None]:
    """What ``serve`` calls once bound: the real addresses (``--port 0`` picks a free one)."""

    def announce(addresses: Sequence[tuple]) -> None:
        where = ", ".join(f"http://[{a[0]}]:{a[1]}" if ":" in a[0] else f"http://{a[0]}:{a[1]}" for a in addresses)
        print(f"sidecar: listening on {where}  traces in {trace_dir}", file=sys.stderr, flush=True)

    return announce


def _trigger_rules(path: Path | None, max_steps: int) -> list:
    """The rules of ``--triggers FILE``; ValueError naming the file and ``rules[i].field``."""
    from .params import ParamError
    from .trigger_rules import parse_rules_file

    if path is None:
        return []
    try:
        return parse_rules_file(path.read_text(encoding="utf-8"), max_steps)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--triggers {path}: cannot be read: {exc}") from None
    except ParamError as exc:
        raise ValueError(f"--triggers {path}: {exc.param}: {exc.message}") from None


def _serve(args: argparse.Namespace) -> int:
    from .app import ServiceSettings, make_app
    from .serving import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s sidecar %(levelname)s %(message)s")
    token, problem = _token(args)
    if problem:
        print(f"sidecar serve: {problem}", file=sys.stderr)
        return 2
    if not _is_loopback(args.host) and not token:
        print(f"sidecar serve: binding {args.host} exposes the API beyond this host; "
              f"give a token with --token or ${config.ENV_TOKEN}", file=sys.stderr)
        return 2
    for name in ("port", "max_steps", "max_capture_mb", "keep", "keep_mb", "min_free_mb"):
        if getattr(args, name) < (0 if name in ("port", "min_free_mb") else 1):
            least = "0 or more" if name in ("port", "min_free_mb") else "positive"
            print(f"sidecar serve: --{name.replace('_', '-')} must be {least}", file=sys.stderr)
            return 2
    try:
        probe_token = auth.ensure_token_file(config.token_file(), token)
        args.trace_dir.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:  # ValueError: a token file that holds no usable token
        print(f"sidecar serve: {exc}", file=sys.stderr)
        return 2
    try:
        triggers = _trigger_rules(args.triggers, args.max_steps)
    except ValueError as exc:
        print(f"sidecar serve: {exc}", file=sys.stderr)
        return 2
    settings = ServiceSettings(
        trace_dir=args.trace_dir.resolve(),
        probe_token=probe_token,
        http_token=token,
        max_steps=args.max_steps,
        max_capture_bytes=args.max_capture_mb * 2**20,
        keep=args.keep,
        keep_bytes=args.keep_mb * 2**20,
        min_free_bytes=args.min_free_mb * 2**20,
        triggers=tuple(triggers),
    )
    from .tracing import start_tracing

    stop_tracing = start_tracing()  # the sidecar's own spans, where OTEL_* names a backend
    try:
        # Not web.run_app: serving.serve answers in JSON even what aiohttp's HTTP parser refuses.
        serve(make_app(settings), args.host, args.port, _listening(settings.trace_dir))
    finally:
        if stop_tracing is not None:
            stop_tracing()
    return 0
