"""What every command that talks to a running sidecar shares: where it is, how it is authenticated,
and how a failure is told to the person at the terminal (one line on stderr, a non-zero exit)."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Callable

from ..common import config
from .client import JobTimeout, SidecarClient, SidecarError

EXIT_ERROR = 2  # the sidecar refused, or could not be reached


def add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help=f"sidecar URL (default ${config.ENV_ENDPOINT} or {config.DEFAULT_ENDPOINT})")
    p.add_argument("--token-file", type=Path, default=None, metavar="FILE",
                   help=f"read the API token from FILE (default: ${config.ENV_TOKEN} if set, else no token; "
                        "a token is never taken on the command line, where every user of the host sees it)")


def make_client(args: argparse.Namespace, timeout: float = 30.0) -> SidecarClient:
    """A client for ``--url`` with the token of ``--token-file``, else of the environment."""
    token = os.environ.get(config.ENV_TOKEN) or None
    if getattr(args, "token_file", None) is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            print(f"sidecar: cannot read the token file {args.token_file}: {exc.strerror or exc}", file=sys.stderr)
            raise SystemExit(EXIT_ERROR) from None
    return SidecarClient(getattr(args, "url", None), token=token or "", timeout=timeout)


def run_command(name: str, client_url: str, work: Callable[[], int]) -> int:
    """``work()``'s exit code; what can go wrong talking to a sidecar becomes one line on stderr."""
    # Imported here, not with the module: `sidecar diff` registers through it, and a diff of two local
    # files would otherwise pay for the HTTP stack's imports (about 50 ms) without using it.
    import http.client
    import urllib.error

    try:
        return work()
    except SidecarError as exc:
        print(f"sidecar {name}: {exc}", file=sys.stderr)
    except JobTimeout as exc:  # the sidecar answered all along; the job did not end in the time waited
        print(f"sidecar {name}: {exc}", file=sys.stderr)
    except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", None) or exc or type(exc).__name__
        print(f"sidecar {name}: cannot reach the sidecar at {client_url}: {reason}", file=sys.stderr)
    except OSError as exc:  # a local file: one the command reads or writes
        print(f"sidecar {name}: {exc}", file=sys.stderr)
    return EXIT_ERROR


def sidecar_command(name: str, timeout: float | Callable[[argparse.Namespace], float] = 30.0
                    ) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Makes ``work(args, client, *more)`` the handler ``(args, *more) -> exit code`` of ``sidecar NAME``.

    The handler builds the client of ``--url`` and ``--token-file`` (``timeout``: seconds, or a function of
    the parsed args for a command whose answer takes as long as the user asks), then runs ``work`` through
    ``run_command``, so that every command tells a refusal or an unreachable sidecar the same way."""

    def decorate(work: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(work)
        def handler(args: argparse.Namespace, *more) -> int:
            # The client first, outside run_command: an unreadable token file is its own message.
            client = make_client(args, timeout(args) if callable(timeout) else timeout)
            return run_command(name, client.url, lambda: work(args, client, *more))

        return handler

    return decorate


def table(rows: list[list[str]], header: list[str]) -> str:
    """Columns padded to their widest cell, the last one left ragged."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        cells = [f"{str(c):<{w}}" for c, w in zip(row, widths)] + [str(row[-1])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
