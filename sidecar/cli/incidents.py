"""``sidecar recorder``, ``sidecar stacks``, ``sidecar requests``, ``sidecar triggers``: the incident views
and the triggers from a shell.

Each is one GET of the sidecar's API (docs/api.md) through ``SidecarClient``: the same answer as
``curl``, written to a file (``-o``; gzip-compressed when the name ends in ``.gz``) or printed. An
error of the sidecar (a bad parameter, no engine connected) or a sidecar out of reach is one line on
stderr and exit status 2 (shared.run_command).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from . import recorder_screen
from .client import SidecarClient
from .shared import add_connection_args, sidecar_command


def _url_arg(p: argparse.ArgumentParser) -> None:
    add_connection_args(p)
    p.add_argument("--processes", default=None, help="only these, e.g. worker, worker:0,engine_core")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("recorder", help="the flight recorder's last seconds of every engine process")
    _url_arg(p)
    p.add_argument("--seconds", type=float, default=120.0, help="how far back (default %(default)s)")
    p.add_argument("--format", choices=("json", "trace"), default=None,
                   help="json rows, or a Chrome/Perfetto trace (default: trace when -o names a .json.gz or "
                        ".trace.json file, else json)")
    p.add_argument("-o", "--output", type=Path, default=None, help="write here (.gz: compressed) instead of printing")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print the JSON rows (the default when not on a terminal)")
    shown.add_argument("--summary", action="store_true",
                       help="print one screen: step-time percentiles and the slowest steps per process, GC pauses, "
                            "TTFT and end-to-end percentiles (the default on a terminal)")
    p.set_defaults(handler=_recorder)

    p = subparsers.add_parser("stacks", help="the Python stack of every thread of every engine process, now")
    _url_arg(p)
    p.add_argument("--seconds", type=float, default=None, help="sample this long instead of one snapshot")
    p.add_argument("--hz", type=float, default=None, help="sampling rate (default 100)")
    p.add_argument("--format", choices=("text", "json", "speedscope"), default="text")
    p.add_argument("--threads", choices=("all", "step"), default=None, help="sample every thread or the step thread")
    p.add_argument("--native", action="store_true", help="native frames too, through py-spy (see docs/incidents.md)")
    p.add_argument("-o", "--output", type=Path, default=None)
    p.set_defaults(handler=_stacks)

    p = subparsers.add_parser("triggers", help="list, add or delete the rules by which a slow server captures itself")
    add_connection_args(p)
    action = p.add_mutually_exclusive_group()
    action.add_argument("--add", type=Path, metavar="FILE", help="add the rules in FILE (one JSON rule, or a list)")
    action.add_argument("--delete", metavar="ID", help="delete this trigger")
    action.add_argument("--show", metavar="ID", help="one trigger with its last firings (JSON)")
    p.set_defaults(handler=_triggers)

    p = subparsers.add_parser("requests", help="the requests in flight across the engine, oldest first")
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(handler=_requests)


def _params(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


def _write(data: bytes, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(data.decode())
        if not data.endswith(b"\n"):
            sys.stdout.write("\n")
        return
    output.write_bytes(gzip.compress(data) if output.name.endswith(".gz") else data)
    print(f"wrote {output} ({output.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)


def _recorder_screen(args: argparse.Namespace) -> bool:
    """One screen instead of the rows: asked for, or printing to a terminal with no data option given
    (a pipe, ``-o``, ``--format`` and ``--json`` keep the data: scripts see what they always saw)."""
    if args.summary:
        return True
    return not (args.json or args.output or args.format) and sys.stdout.isatty()


@sidecar_command("recorder", timeout=60)
def _recorder(args: argparse.Namespace, client: SidecarClient) -> int:
    if args.summary and (args.output or args.format == "trace"):
        print("sidecar recorder: --summary prints a screen; it takes neither -o nor --format trace", file=sys.stderr)
        return 2
    if _recorder_screen(args):
        answer = client.request("GET", "/recorder", _params(seconds=args.seconds, format="json",
                                                            processes=args.processes))
        sys.stdout.write(recorder_screen.render(answer, args.seconds))
        return 0
    fmt = args.format
    if fmt is None:
        fmt = "trace" if args.output and args.output.name.endswith((".json.gz", ".trace.json")) else "json"
    params = _params(seconds=args.seconds, format=fmt, processes=args.processes)
    _write(client.get_bytes("/recorder", params), args.output)
    return 0


@sidecar_command("stacks", timeout=lambda args: (args.seconds or 0) + 30)  # a sample takes the seconds asked for
def _stacks(args: argparse.Namespace, client: SidecarClient) -> int:
    params = _params(seconds=args.seconds, hz=args.hz, format=args.format, threads=args.threads,
                     processes=args.processes, mode="native" if args.native else None)
    _write(client.get_bytes("/stacks", params), args.output)
    return 0


@sidecar_command("requests")
def _requests(args: argparse.Namespace, client: SidecarClient) -> int:
    answer = client.request("GET", "/requests")
    if args.json:
        print(json.dumps(answer, indent=1))
        return 0
    print(f"{answer['count']} requests in flight" +
          (f", the oldest {answer['oldest_age_s']:.1f} s old" if answer.get("oldest_age_s") is not None else ""))
    for r in answer["requests"]:
        print(f"  {r.get('age_s', 0):8.1f} s  {r.get('phase', '?'):<9} prompt {r.get('prompt_tokens')}, "
              f"output {r.get('output_tokens')}  {r.get('id')}")
    for p in answer["processes"]:
        if p.get("error"):
            print(f"  ({p['process']}: {p['error']})")
    return 0


@sidecar_command("triggers")
def _triggers(args: argparse.Namespace, client: SidecarClient) -> int:
    try:
        _change_triggers(args, client)
    except ValueError as exc:  # the rules file is not JSON
        print(f"sidecar triggers: {args.add}: {exc}", file=sys.stderr)
        return 2
    return 0


def _change_triggers(args: argparse.Namespace, client: SidecarClient) -> None:
    """Adds, deletes, shows or lists the triggers, as the flags of ``sidecar triggers`` ask."""
    if args.add is not None:
        rules = json.loads(args.add.read_text())
        for rule in rules if isinstance(rules, list) else [rules]:
            added = json.loads(client.call("POST", "/triggers", body=rule))
            print(f"added {added['id']}: {added['rule']['name']}")
    elif args.delete is not None:
        client.call("DELETE", f"/triggers/{args.delete}")
        print(f"deleted {args.delete}")
    elif args.show is not None:
        print(json.dumps(client.request("GET", f"/triggers/{args.show}"), indent=1))
    else:
        listed = client.request("GET", "/triggers")["triggers"]
        print(f"{len(listed)} triggers")
        for t in listed:
            counts = t.get("counts", {})
            print(f"  {t['id']}  {t['rule']['name']}  fired {counts.get('fired', 0)}, "
                  f"skipped {counts.get('skipped', 0)}")
