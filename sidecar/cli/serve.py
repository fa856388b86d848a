"""``sidecar serve``: run the sidecar service beside an engine."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import logging
import os
import re
import stat
import sys
from pathlib import Path
from typing import Callable, Sequence

from ..common import auth, config


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
    p.add_argument("--alert-actions", type=Path, default=None, metavar="FILE",
                   help="what POST /alerts (Alertmanager's webhook) does with an alert: a JSON list of "
                        "{match, action, cooldown_s, budget_per_hour} (docs/api.md, Alerts)")
    p.add_argument("--alert-instance", action="append", default=[], type=_alert_instance, metavar="HOST:PORT",
                   help="the instance label by which alerts name this sidecar's server (where Prometheus scrapes "
                        "it); repeat for more. Default: this host's names and addresses, on the port the "
                        "notification reached (docs/api.md, Alerts)")
    p.add_argument("--allowed-host", action="append", default=[], type=_allowed_host, metavar="NAME",
                   help="a host name a browser may use to reach the sidecar besides loopback names and IP "
                        "addresses, e.g. a Service or ingress name; repeat for more")
    p.add_argument("--store", default=None, metavar="URL",
                   help="also keep every finished capture, scan, module timing and recorder dump in object storage, "
                        "uploaded in the background: s3://bucket/prefix, gs://bucket/prefix, az://container/prefix "
                        "or file:///shared/volume; credentials from the cloud's standard chain, for S3 the endpoint "
                        "from $AWS_ENDPOINT_URL where set (docs/fleet.md, Object storage)")
    p.add_argument("--store-instance", default=None, type=_store_instance, metavar="NAME",
                   help="this sidecar's name in the store's fleet folders and recorder dumps (default: the host "
                        "name, in Kubernetes the pod's)")
    p.add_argument("--store-queue", type=int, default=64, metavar="N",
                   help="uploads waiting at most; when full, the oldest waiting is dropped and counted "
                        "(default %(default)s)")
    p.add_argument("--store-retention", action="store_true",
                   help="--keep and --keep-mb remove the stored copies too (by default they remove the local "
                        "copies only, and stored captures stay listed)")
    p.add_argument("--log-level", default="INFO")
    p.set_defaults(handler=_serve)


def _is_loopback(host: str) -> bool:
    return config.is_loopback_host(host)


# A DNS host name (RFC 1123 labels; "_" too, which some internal names use), lower-cased already.
_HOST_NAME = re.compile(r"(?=.{1,253}$)(?!-)[a-z0-9_-]{1,63}(?<!-)(?:\.(?!-)[a-z0-9_-]{1,63}(?<!-))*")


def _allowed_host(value: str) -> str:
    """One ``--allowed-host``: a bare host name, lower-cased (a Host header's name is compared without
    its case). No port: a page that rebinds a name to the sidecar reaches it on the sidecar's own port
    anyway, so a port would protect nothing and give the check two forms to get wrong. No IP address:
    addresses are always allowed. Refused with a message naming the value (argparse exits 2)."""
    name = value.lower()
    problem = None
    if not value.strip():
        problem = "must not be empty"
    elif any(c.isspace() for c in value):
        problem = "must not contain spaces"
    elif "://" in value:
        problem = "give the host name alone, without a scheme (http://)"
    elif "/" in value:
        problem = "give the host name alone, without a path"
    elif config.is_ip_address(value.strip("[]")):
        problem = "an IP address is always allowed: give host names only"
    elif ":" in value:
        problem = "give the host name without a port: every port of an allowed name is allowed"
    elif not value.isascii():
        problem = "give a name beyond ASCII in its punycode form (xn--...), as a browser sends it"
    elif not _HOST_NAME.fullmatch(name):
        problem = "not a host name (dot-separated labels of letters, digits, '-' and '_', at most 63 each)"
    if problem:
        raise argparse.ArgumentTypeError(f"{value!r}: {problem}")
    return name


def _store_instance(value: str) -> str:
    """``--store-instance``: one segment of the store's keys (argparse exits 2 otherwise)."""
    from ..service.store.layout import instance_name

    if not value or instance_name(value) != value:
        raise argparse.ArgumentTypeError(f"{value!r}: use 1 to 64 of A-Z, a-z, 0-9, '.', '_' and '-'")
    return value


def _store_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--store`` and ``--store-queue``, or None: the URL is opened here (no
    network, no credential read) so that a bad one is a message, not a traceback at start."""
    if args.store_queue < 1:
        return "--store-queue must be positive"
    if args.store is None:
        return None
    from ..service.store.client import open_store

    try:
        open_store(args.store)
    except ValueError as exc:
        return f"--store: {exc}"
    return None


def _alert_instance(value: str) -> str:
    """One ``--alert-instance``, as Prometheus writes an ``instance`` label (argparse exits 2 otherwise)."""
    from ..service.incidents.alert_actions import instance_problem

    problem = instance_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(f"{value!r}: {problem}")
    return value


LOOPBACK_PAIR = ("127.0.0.1", "::1")


def _bind_hosts(host: str) -> tuple[list[str], list[str]]:
    """The addresses ``--host`` binds, and those of them this machine may lack.

    127.0.0.1, ``localhost`` and ::1 bind both loopback addresses, the one asked for first:
    ``localhost`` may resolve to ::1 first, and a process of another user listening on [::1] at the
    sidecar's port would get the clients (and tokens) that say ``localhost``. A host without IPv6 goes
    on with 127.0.0.1 alone (``serving.bind``'s ``optional``)."""
    if host.lower() == "localhost":
        first = LOOPBACK_PAIR[0]
    elif config.is_ip_address(host) and str(ipaddress.ip_address(host)) in LOOPBACK_PAIR:
        first = str(ipaddress.ip_address(host))
    else:
        return [host], []
    other = next(h for h in LOOPBACK_PAIR if h != first)
    return [first, other], [other]


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


def _listening(trace_dir: Path) -> Callable[[Sequence[tuple], Sequence[tuple[str, OSError]]], None]:
    """What ``serve`` calls once bound: the real addresses (``--port 0`` picks a free one), and the
    loopback address this machine lacks, if any."""
    from ..service.serving import url_host

    def announce(addresses: Sequence[tuple], left_out: Sequence[tuple[str, OSError]]) -> None:
        for host, exc in left_out:
            print(f"sidecar serve: this host has no {host} ({exc.strerror or exc}): serving "
                  f"{' and '.join(a[0] for a in addresses)} alone", file=sys.stderr)
        # " and ", not ", ": a reader of the first URL takes what runs up to the next space.
        where = " and ".join(f"http://{url_host(a[0])}:{a[1]}" for a in addresses)
        print(f"sidecar: listening on {where}  traces in {trace_dir}", file=sys.stderr, flush=True)

    return announce


def _make_trace_dir(path: Path) -> None:
    """Create the trace dir 0700 (its parents too, under ``sidecar serve``'s umask 077). An existing
    one is left as it is: it may be a volume shared on purpose (the engine's probes write into it),
    and its mode is its owner's choice; where others can enter it, a warning says so, since traces
    hold op names, shapes, Python stacks and pids."""
    if not path.is_dir():
        path.mkdir(parents=True, mode=0o700)
        return
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        print(f"sidecar serve: warning: the trace dir {path} is open to other users (mode {mode:04o}); "
              f"the files the sidecar writes there are 0600, but to keep the traces' names private too, "
              f"chmod 700 {path} unless others need it", file=sys.stderr)


def _bind_problem(exc: OSError, companion: bool) -> str:
    """``sidecar serve``'s message for an address it cannot listen on."""
    if exc.errno != errno.EADDRINUSE:
        return str(exc)
    if companion:
        return (f"{exc}: another process listens there, and a client that resolves localhost to "
                f"{exc.host} would reach it instead of the sidecar; stop it, or choose another --port")
    return f"{exc}: another process listens there; stop it, or choose another --port"


def _rules_file(flag: str, path: Path | None, parse: Callable[[str, int], list], max_steps: int) -> list:
    """What ``parse`` makes of the file of ``flag`` (none: nothing); ValueError naming the flag, the
    file and the field (``rules[i].field``, ``[i].field``)."""
    from ..service.jobs.params import ParamError

    if path is None:
        return []
    try:
        return parse(path.read_text(encoding="utf-8"), max_steps)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{flag} {path}: cannot be read: {exc}") from None
    except ParamError as exc:
        raise ValueError(f"{flag} {path}: {exc.param}: {exc.message}") from None


def _trigger_rules(path: Path | None, max_steps: int) -> list:
    """The rules of ``--triggers FILE``; ValueError naming the file and ``rules[i].field``."""
    from ..service.incidents.trigger_rules import parse_rules_file

    return _rules_file("--triggers", path, parse_rules_file, max_steps)


def _alert_actions(path: Path | None, max_steps: int) -> list:
    """The actions of ``--alert-actions FILE``; ValueError naming the file and ``[i].field``."""
    from ..service.incidents.alert_actions import parse_alert_actions_file

    return _rules_file("--alert-actions", path, parse_alert_actions_file, max_steps)


def _serve(args: argparse.Namespace) -> int:
    from ..service.app import ServiceSettings, make_app
    from ..service.serving import BindError, serve

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
    store_problem = _store_problem(args)
    if store_problem:
        print(f"sidecar serve: {store_problem}", file=sys.stderr)
        return 2
    # Everything the sidecar writes from here on is its user's alone (the token, traces, results):
    # this process is `sidecar serve` itself, so the umask is its own to set.
    os.umask(0o077)
    try:
        probe_token = auth.ensure_token_file(config.token_file(), token)
        _make_trace_dir(args.trace_dir)
    except (OSError, ValueError) as exc:  # ValueError: a token file that holds no usable token
        print(f"sidecar serve: {exc}", file=sys.stderr)
        return 2
    try:
        triggers = _trigger_rules(args.triggers, args.max_steps)
        alert_actions = _alert_actions(args.alert_actions, args.max_steps)
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
        alert_actions=tuple(alert_actions),
        alert_instances=tuple(dict.fromkeys(args.alert_instance)),
        allowed_hosts=tuple(dict.fromkeys(args.allowed_host)),
        store_url=args.store,
        store_instance=args.store_instance,
        store_queue=args.store_queue,
        store_retention=args.store_retention,
    )
    from ..service.tracing import start_tracing

    hosts, optional = _bind_hosts(args.host)
    stop_tracing = start_tracing()  # the sidecar's own spans, where OTEL_* names a backend
    try:
        # Not web.run_app: serving.serve answers in JSON even what aiohttp's HTTP parser refuses.
        serve(make_app(settings), hosts, args.port, _listening(settings.trace_dir), optional=optional)
    except BindError as exc:
        print(f"sidecar serve: {_bind_problem(exc, exc.host != hosts[0])}", file=sys.stderr)
        return 2
    finally:
        if stop_tracing is not None:
            stop_tracing()
    return 0
