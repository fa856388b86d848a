"""``sidecar analyze PATH [--json] [--top N]``: explain a Kineto / Chrome trace at once."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze",
        help="summarise a Kineto/Chrome trace (.json, .json.gz, or a folder of rank files)",
        description="GPU busy time, top kernels, idle gaps and their causes, syncs, collectives and per-step figures of a trace.",
    )
    p.add_argument("path", help="trace file (.json or .json.gz) or folder of rank files")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (schema: docs/analysis.md)")
    p.add_argument("--top", type=_positive, default=10, metavar="N", help="entries in each top-N list (default %(default)s)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    # Imported here so that other sub-commands do not pay for the analyser's imports.
    from . import TraceFormatError, analyze_path, format_report

    try:
        summary = analyze_path(args.path, top_n=args.top)
    except TraceFormatError as exc:
        print(f"sidecar analyze: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(summary, sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_report(summary))
    return 0


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
