"""What every ``sidecar fleet`` command shares: its arguments (where the targets are, how to ask
them), the discovery, a client per target with its own token, one line per failure, the progress
line, the answer's ``failed`` list and the exit status (docs/fleet.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ..common import config
from ..fleet.fanout import DEFAULT_CONCURRENCY, MAX_CONCURRENCY, Outcome, run_all
from ..fleet.targets import Target, TargetError, Tokens, from_file, from_list, read_tokens
from .client import SidecarClient, SidecarError
from .shared import EXIT_ERROR

EXIT_PARTIAL = 1  # some targets answered, some did not (or a capture ended other than done)
DEFAULT_TIMEOUT_S = 10.0


def ranged(kind: type, lo: float, hi: float) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}: {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be between {lo:g} and {hi:g}, got {text}")
        return value

    return parse


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("targets (one of)")
    source = where.add_mutually_exclusive_group(required=True)
    source.add_argument("--prometheus", metavar="URL", help="the active targets of a Prometheus scrape job (with --job)")
    source.add_argument("--k8s-selector", metavar="SELECTOR",
                        help="the running pods of a Kubernetes label selector, e.g. app=inference-server (in-cluster or kubeconfig)")
    source.add_argument("--targets", metavar="URL,URL", help="these sidecars (a port left out is --port)")
    source.add_argument("--targets-file", type=Path, metavar="FILE", help="the sidecars in FILE, one URL a line (# comments)")
    where.add_argument("--job", help="with --prometheus: the scrape job whose targets are the sidecars")
    where.add_argument("--port", type=ranged(int, 1, 65535), default=None,
                       help=f"the sidecars' port: of each pod (default {config.DEFAULT_PORT}); with --prometheus, "
                            "instead of the scrape URL's; for a listed URL without one")
    where.add_argument("--namespace", default=None, help="with --k8s-selector (default: the context's, or default)")
    where.add_argument("--all-namespaces", action="store_true", help="with --k8s-selector: every namespace")
    where.add_argument("--kubeconfig", default=None, help="with --k8s-selector (default: in-cluster, else $KUBECONFIG "
                                                          "or ~/.kube/config)")
    where.add_argument("--context", default=None, help="with --k8s-selector: the kubeconfig context")
    where.add_argument("--scheme", choices=("http", "https"), default="http", help="with --k8s-selector (default http)")
    how = p.add_argument_group("how")
    how.add_argument("--tokens-file", type=Path, default=None, metavar="FILE",
                     help='a token per target: JSON {"<target URL or host:port or host>": "<token>", "*": "<any other>"}')
    how.add_argument("--token-file", type=Path, default=None, metavar="FILE",
                     help=f"one token for every target not in --tokens-file (default ${config.ENV_TOKEN}, else none)")
    how.add_argument("--concurrency", type=ranged(int, 1, MAX_CONCURRENCY), default=DEFAULT_CONCURRENCY,
                     help="targets asked at once (default %(default)s)")
    how.add_argument("--timeout", type=ranged(float, 0.1, 600), default=DEFAULT_TIMEOUT_S,
                     help="seconds each request to a target may take (default %(default)s)")
    how.add_argument("--json", action="store_true", help="print one JSON answer")


# -- targets and clients -------------------------------------------------------------------------------

class Fleet:
    """The targets found, the failures known before asking (pods not running), a client per target."""

    def __init__(self, targets: list[Target], failed: list[dict[str, str]], tokens: Tokens, timeout: float,
                 concurrency: int) -> None:
        self.targets, self.failed, self.timeout, self.concurrency = targets, failed, timeout, concurrency
        self._tokens = tokens

    def client(self, target: Target, timeout: float | None = None) -> SidecarClient:
        # "" and not None: a target without a token must not fall back to $SIDECAR_TOKEN of the client.
        return SidecarClient(target.url, token=self._tokens.for_target(target) or "", timeout=timeout or self.timeout)


def discover(args: argparse.Namespace) -> tuple[list[Target], list[dict[str, str]]]:
    """The targets of the form given, and the failures discovery itself found; ``TargetError``."""
    if args.prometheus is not None:
        if not args.job:
            raise TargetError("--prometheus needs --job NAME: the scrape job whose targets are the sidecars")
        from ..fleet.prometheus import job_targets

        return job_targets(args.prometheus, args.job, timeout=args.timeout, port=args.port), []
    if args.job:
        raise TargetError("--job goes with --prometheus")
    k8s_only = [flag for flag, value in (("--namespace", args.namespace), ("--all-namespaces", args.all_namespaces),
                                         ("--kubeconfig", args.kubeconfig), ("--context", args.context)) if value]
    if args.k8s_selector is not None:
        if args.namespace and args.all_namespaces:
            raise TargetError("--namespace and --all-namespaces: one or the other")
        from ..fleet.k8s import selector_targets

        pods = selector_targets(args.k8s_selector, port=args.port or config.DEFAULT_PORT, namespace=args.namespace,
                                all_namespaces=args.all_namespaces, kubeconfig=args.kubeconfig, context=args.context,
                                scheme=args.scheme, timeout=args.timeout)
        return pods.targets, [{"target": name, "error": why} for name, why in pods.not_ready]
    if k8s_only:
        raise TargetError(f"{', '.join(k8s_only)} go{'es' if len(k8s_only) == 1 else ''} with --k8s-selector")
    port = args.port or config.DEFAULT_PORT
    return (from_list(args.targets, port) if args.targets is not None else from_file(args.targets_file, port)), []


def tokens_of(args: argparse.Namespace) -> Tokens:
    default = os.environ.get(config.ENV_TOKEN) or None
    if args.token_file is not None:
        try:
            default = args.token_file.read_text().strip() or None
        except OSError as exc:
            raise TargetError(f"cannot read the token file {args.token_file}: {exc.strerror or exc}") from None
    if args.tokens_file is None:
        return Tokens((), default)
    tokens, warning = read_tokens(args.tokens_file, default)
    if warning:
        print(f"sidecar fleet: warning: {warning}", file=sys.stderr)
    return tokens


def describe_error(exc: BaseException, timeout: float | None = None) -> str:
    """A target's failure in one line, never a traceback (and never its token)."""
    import http.client
    import socket
    import urllib.error

    if isinstance(exc, SidecarError):
        return str(exc)
    if isinstance(exc, (TimeoutError, socket.timeout)) or (
            isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, (TimeoutError, socket.timeout))):
        return f"no answer within {timeout:g} s" if timeout else "timed out"
    if isinstance(exc, urllib.error.URLError):
        return f"cannot reach the sidecar: {exc.reason}"
    if isinstance(exc, (ConnectionError, http.client.HTTPException)):
        return f"cannot reach the sidecar: {exc or type(exc).__name__}"
    if isinstance(exc, ValueError):
        return f"not a sidecar's answer: {exc}"
    if isinstance(exc, KeyError):
        return f"not a sidecar's answer: no {exc} in it"
    return f"{type(exc).__name__}: {exc}"


class Progress:
    """One line on a terminal's stderr while the targets answer; nothing when stderr is not a terminal."""

    def __init__(self, what: str, stream=None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._on = self._stream.isatty()
        self._what = what
        self._began = time.monotonic()
        self._shown = False

    def __call__(self, done: int, failed: int, total: int, doing: str = "answered") -> None:
        if self._on:
            line = (f"sidecar fleet {self._what}: {done}/{total} {doing}" + (f", {failed} failed" if failed else "")
                    + f" ({time.monotonic() - self._began:.1f} s)")
            self._stream.write("\r\033[K" + line)
            self._stream.flush()
            self._shown = True

    def close(self) -> None:
        if self._shown:
            self._stream.write("\r\033[K")
            self._stream.flush()


def run_fleet(args: argparse.Namespace, name: str, work: Callable[[argparse.Namespace, Fleet], int]) -> int:
    """Finds the targets, then ``work(args, fleet)``; a discovery or argument fault is one line and exit 2."""
    try:
        targets, failed = discover(args)
        fleet = Fleet(targets, failed, tokens_of(args), args.timeout, args.concurrency)
    except TargetError as exc:
        print(f"sidecar fleet {name}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if not targets:
        print(f"sidecar fleet {name}: no target to ask: " + "; ".join(f"{f['target']}: {f['error']}" for f in failed),
              file=sys.stderr)
        return EXIT_ERROR
    try:
        return work(args, fleet)
    except TargetError as exc:  # a local file the command reads (--add)
        print(f"sidecar fleet {name}: {exc}", file=sys.stderr)
        return EXIT_ERROR


def ask(fleet: Fleet, name: str, call: Callable[[SidecarClient], Any], timeout: float | None = None) -> list[Outcome]:
    """``call(client)`` on every target, with the progress line."""
    progress = Progress(name)
    try:
        return run_all(fleet.targets, lambda t: call(fleet.client(t, timeout)),
                       lambda exc: describe_error(exc, timeout or fleet.timeout),
                       concurrency=fleet.concurrency, on_progress=progress)
    finally:
        progress.close()


def failures(fleet: Fleet, outcomes: list[Outcome]) -> list[dict[str, str]]:
    return fleet.failed + [{"target": o.target.url, "error": o.error} for o in outcomes if not o.ok]


def exit_status(answered: int, failed: int, all_done: bool = True) -> int:
    if answered == 0:
        return EXIT_ERROR
    return EXIT_PARTIAL if failed or not all_done else 0


def replica(target: Target, **fields: Any) -> dict[str, Any]:
    return {"target": target.url, "name": target.name or None, **fields}


def print_json(answer: dict[str, Any]) -> None:
    print(json.dumps(answer, indent=1))


def print_failed(failed: list[dict[str, str]]) -> None:
    if failed:
        print(f"not answered ({len(failed)}):")
        for f in failed:
            print(f"  {f['target']}: {f['error']}")


def finish(args: argparse.Namespace, fleet: Fleet, outcomes: list[Outcome], replicas: list[dict[str, Any]],
            text: Callable[[], None]) -> int:
    failed = failures(fleet, outcomes)
    if args.json:
        print_json({"replicas": replicas, "failed": failed})
    else:
        text()
        print_failed(failed)
    return exit_status(len(replicas), len(failed))
