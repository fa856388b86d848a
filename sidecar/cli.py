"""sidecar: profile a running LLM inference engine (serve, capture, analyze, make-model).

Each sub-command lives with the concept it drives and registers itself through a small
``register(subparsers)`` function, so this module stays a dispatcher.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Sequence

# Modules that contribute a sub-command: each has register(subparsers) which adds a parser whose
# ``handler`` default is a callable taking the parsed args and returning an exit code.
_COMMAND_MODULES = (
    "sidecar.service.cli",
    "sidecar.client",
    "sidecar.analysis.cli",
    "sidecar.devtools.local_model",
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(prog="sidecar", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
