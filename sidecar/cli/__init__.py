"""sidecar: profile a running LLM inference engine (serve, capture, sync, status, analyze, diff, ...).

Each sub-command lives in a module of its own and registers itself through a small
``register(subparsers)`` function; this module stays a dispatcher and imports a command's module only
when that command is chosen (``_COMMAND_MODULES``).

    __main__    ``python -m sidecar.cli``
    shared      what every command that talks to a sidecar shares: where it is, its token, one-line errors
    client      the Python client of the HTTP API (the commands, tests and benchmarks use it)
    serve       ``sidecar serve``: the sidecar service beside an engine
    jobs        ``sidecar capture``, ``sync``, ``status``, ``list``, ``stop``, ``summary``, ``download``, ``watch``, ``metrics``
    modules     ``sidecar modules``: which layer of the running model is slow
    memory      ``sidecar memory``: the CUDA caching allocator over N steps: peak, sites, fragmentation
    incidents   ``sidecar recorder``, ``stacks``, ``requests``, ``triggers``
    fleet       ``sidecar fleet``: a command on many sidecars at once (fleet_common: what they share;
                fleet_compare: ``fleet capture`` and ``fleet recorder``, the replicas compared)
    alerts      ``sidecar alerts``: what came of Alertmanager's alerts; ``--send`` one notification
    analyze     ``sidecar analyze``: a trace explained at once
    diff        ``sidecar diff``: what changed from one trace (or capture) to another
    one_shot    the process set-up of a command-line analysis (no cyclic GC, no BLAS worker threads)
    make_model  ``sidecar make-model``: a small random-weight Llama model, no model hub needed
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

# Sub-command → the module that contributes it: each has register(subparsers), which adds a parser
# whose ``handler`` default is a callable taking the parsed args and returning an exit code.
_COMMAND_MODULES = {
    "serve": "sidecar.cli.serve",
    "capture": "sidecar.cli.jobs",
    "sync": "sidecar.cli.jobs",
    "status": "sidecar.cli.jobs",
    "list": "sidecar.cli.jobs",
    "stop": "sidecar.cli.jobs",
    "summary": "sidecar.cli.jobs",
    "download": "sidecar.cli.jobs",
    "watch": "sidecar.cli.jobs",
    "metrics": "sidecar.cli.jobs",
    "modules": "sidecar.cli.modules",
    "memory": "sidecar.cli.memory",
    "recorder": "sidecar.cli.incidents",
    "stacks": "sidecar.cli.incidents",
    "requests": "sidecar.cli.incidents",
    "triggers": "sidecar.cli.incidents",
    "alerts": "sidecar.cli.alerts",
    "analyze": "sidecar.cli.analyze",
    "diff": "sidecar.cli.diff",
    "make-model": "sidecar.cli.make_model",
    "fleet": "sidecar.cli.fleet",
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command, or of ``only`` when it names one. A command named on the
    line needs only its own module: importing the others (the service pulls in logging, ipaddress,
    ...) cost ``sidecar analyze`` about 10 ms of a 0.4 s run."""
    import importlib

    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    registered: set[str] = set()  # a module may contribute several commands: register it once
    for command, module in _COMMAND_MODULES.items():
        if (only is None or command == only) and module not in registered:
            importlib.import_module(module).register(sub)
            registered.add(module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    first = args_in[0] if args_in else None
    parser = build_parser(first if first in _COMMAND_MODULES else None)
    args = parser.parse_args(args_in)
    # Whether the command is this process's own command line (the console script, python -m), not a
    # call from other code: only then may it shape how the process exits (analysis/one_shot.py).
    args.whole_process = argv is None
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130

