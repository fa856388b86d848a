"""sidecar: profile a running LLM inference engine (serve, capture, sync, status, analyze, diff, ...).

Each sub-command lives with the concept it drives and registers itself through a small
``register(subparsers)`` function, so this module stays a dispatcher.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

# Sub-command → the module that contributes it: each has register(subparsers), which adds a parser
# whose ``handler`` default is a callable taking the parsed args and returning an exit code.
_COMMAND_MODULES = {
    "serve": "sidecar.service.cli",
    "capture": "sidecar.jobs_cli",
    "sync": "sidecar.jobs_cli",
    "status": "sidecar.jobs_cli",
    "list": "sidecar.jobs_cli",
    "stop": "sidecar.jobs_cli",
    "summary": "sidecar.jobs_cli",
    "download": "sidecar.jobs_cli",
    "watch": "sidecar.jobs_cli",
    "metrics": "sidecar.jobs_cli",
    "modules": "sidecar.modules_cli",
    "recorder": "sidecar.incident_cli",
    "stacks": "sidecar.incident_cli",
    "requests": "sidecar.incident_cli",
    "triggers": "sidecar.incident_cli",
    "analyze": "sidecar.analysis.cli",
    "diff": "sidecar.analysis.diff_cli",
    "make-model": "sidecar.devtools.local_model",
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


if __name__ == "__main__":
    sys.exit(main())
