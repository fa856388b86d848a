"""``sidecar analyze PATH [--json] [--top N] [--html FILE]``: explain a Kineto / Chrome trace at once."""

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
    p.add_argument("--syncs", action="store_true",
                   help="also name every sync's site as a live sync scan does (file:line, op, phase, hidden or "
                        "expected; docs/syncs.md); JSON: the summary's sync_scan")
    p.add_argument("--html", metavar="FILE", default=None,
                   help="also write the report as one self-contained HTML page (charts, findings; docs/report.md)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from .one_shot import one_shot

    # No cyclic GC, no BLAS threads, no collection at exit: start-up and exit are much of its time.
    with one_shot(getattr(args, "whole_process", False)):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from ..analysis.reader.halves import start_head

    # A second reader of a large file's head, forked before numpy loads (sidecar/analysis/reader/halves.py).
    head = start_head(args.path)
    try:
        return _analyse(args, head)
    finally:
        if head is not None:
            head.cancel()


def _analyse(args: argparse.Namespace, head) -> int:
    # Imported here so that other sub-commands do not pay for the analyser's imports.
    from ..analysis import TraceFormatError, analyze_path, format_report

    try:
        summary = analyze_path(args.path, top_n=args.top, head=head)
        if args.syncs:
            from ..analysis.sync_sites import scan_trace

            summary["sync_scan"] = scan_trace(args.path)
    except TraceFormatError as exc:
        print(f"sidecar analyze: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(summary, sys.stdout, indent=1, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_report(summary))
        if args.syncs:
            sys.stdout.write(format_sync_sites(summary["sync_scan"]))
    if args.html:
        return _write_html(summary, args.html)
    return 0


def _write_html(summary: dict, out: str) -> int:
    from ..report import write_html_report  # only when asked: the pages' modules are not the analyser's

    try:
        path = write_html_report(summary, out)
    except OSError as exc:
        print(f"sidecar analyze: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"sidecar analyze: report written to {path}", file=sys.stderr)
    return 0


def format_sync_sites(scan: dict) -> str:
    """The trace scan's sites as a table: where each sync is in the code and whether it is expected."""
    from ..analysis.text import _t as duration  # the report's way of writing a duration

    sites = scan["sites"]
    if not sites:
        return "\nSync sites: none\n"
    lines = ["", f"Sync sites ({len(sites)}; hidden first):",
             f"  {'count':>7} {'blocked':>10} {'class':>9} {'phase':>10}  {'op / runtime call':<40} site"]
    for s in sites:
        where = f"{s['path'] or s['file']}:{s['line']}" if s.get("line") else s["function"] or s["cpu_op"] or "outside any recorded op"
        if s.get("line") and s["function"]:
            where += f" ({s['function']})"
        lines.append(f"  {s['count']:>7,} {duration(s['blocked_us']):>10} {s['classification']:>9} {s['phase']:>10}  "
                     f"{s['op'] + ' / ' + s['api'] if s.get('api') else s['op']:<40} {where}")
    return "\n".join(lines) + "\n"



def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value
