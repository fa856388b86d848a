"""``sidecar diff A B [--json] [--top N]``: what changed from one trace (or capture) to another.

A and B are each a trace file, a folder of rank files, or the id of a finished capture on a running
sidecar. Two ids are diffed by the sidecar itself (``GET /profile/{a}/diff/{b}``); a file is
analysed here, with every kernel and op name listed so that none drops out of the comparison, and
two files at once (sidecar/analysis/diff/pair.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .client import SidecarClient
from .shared import EXIT_ERROR, add_connection_args, sidecar_command


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "diff",
        help="compare two traces or captures: step time, GPU busy, kernels, ops, syncs, gaps; noise flagged",
        description="What changed from A (before) to B (after): per-step figures, then per kernel, CPU op, sync "
                    "API and gap cause, each with the delta and the ratio, largest change first; a change within "
                    "the steps' run-to-run spread is flagged as noise (docs/analysis.md, sidecar diff).",
    )
    p.add_argument("a", metavar="A", help="before: a trace file (.json or .json.gz), a folder of rank files, or a capture id")
    p.add_argument("b", metavar="B", help="after: the same")
    p.add_argument("--json", action="store_true", help="print the diff as JSON (schema: docs/analysis.md)")
    p.add_argument("--top", type=_positive, default=10, metavar="N",
                   help="changed rows shown per section in the text (default %(default)s; --json has all)")
    add_connection_args(p)  # for capture ids
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .one_shot import one_shot

    with one_shot(getattr(args, "whole_process", False)):  # as `sidecar analyze` (one_shot.py)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    captures = [_is_capture_id(x) for x in (args.a, args.b)]
    if not any(captures):
        return _finish(args, _diff_files(args.a, args.b))
    return _diff_captures(args, captures)


@sidecar_command("diff")
def _diff_captures(args: argparse.Namespace, client: SidecarClient, captures: list[bool]) -> int:
    """The diff of A and B where one (``captures``: which) or both are captures of the sidecar."""
    if all(captures):
        return _finish(args, client.request("GET", f"/profile/{args.a}/diff/{args.b}"))
    from ..analysis.diff.changes import diff_summaries

    summaries = [client.summary(x) if remote else _analyse(x) for x, remote in zip((args.a, args.b), captures)]
    if None in summaries:
        return EXIT_ERROR
    return _finish(args, diff_summaries(*summaries))


def _diff_files(a: str, b: str) -> dict | None:
    """The diff of two trace files or folders, read at once where there is a core to spare (sidecar/analysis/diff/pair.py)."""
    from ..analysis import analyze_path
    from ..analysis.diff.changes import diff_summaries
    from ..analysis.diff.pair import analyse_pair

    outcomes = analyse_pair(a, b, lambda path: analyze_path(path, all_names=True))
    for _summary, error in outcomes:
        if error is not None:  # A's first: one line, as `sidecar analyze` says it
            print(f"sidecar diff: {error}", file=sys.stderr)
            return None
    return diff_summaries(outcomes[0][0], outcomes[1][0])


def _analyse(path: str) -> dict | None:
    """The summary of a trace file or folder, every name listed; None (and one line on stderr) when unreadable."""
    from ..analysis import TraceFormatError, analyze_path

    try:
        return analyze_path(path, all_names=True)
    except TraceFormatError as exc:
        print(f"sidecar diff: {exc}", file=sys.stderr)
        return None


def _finish(args: argparse.Namespace, diff: dict | None) -> int:
    if diff is None:
        return EXIT_ERROR
    if args.json:
        json.dump(diff, sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        from ..analysis.diff.text import format_diff

        sys.stdout.write(format_diff(diff, top=args.top))
    return 0


def _is_capture_id(text: str) -> bool:
    """A capture id that is not also a file here: a file of that name is what the user meant."""
    if Path(text).exists():
        return False
    from ..service.jobs.model import CAPTURE  # imported only for a name that is no file: it pulls in asyncio

    return CAPTURE.is_id(text)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
