"""``sidecar modules``: time every nn.Module of the running model for N steps, print which layer is slow.

Starts a module-timing job (``/modules/start``), waits for it and prints two tables: module types by
self time, and the modules themselves by self time (docs/cli.md); ``--json`` prints the job's JSON.
``sidecar modules ID`` shows a finished job again.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..common import config
from .client import SidecarClient
from .shared import add_connection_args, sidecar_command, table
from .jobs import EXIT_NOT_DONE, Progress


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "modules", help="time every nn.Module of the model for N steps (forward hooks): which layer is slow",
        description="Start a module-timing job (GET /modules/start), wait for it, print time per module type and "
                    "per module (docs/api.md, Module timing). Exit 0 when done, 1 when it ended otherwise, 2 on an error.")
    add_connection_args(p)
    p.add_argument("id", nargs="?", default=None, help="show this finished job (m...) instead of starting one")
    p.add_argument("--steps", type=int, default=5, help="working steps to time, at most 100 (default %(default)s)")
    p.add_argument("--delay", type=int, default=None, help="working steps to skip first (default 0)")
    p.add_argument("--processes", default=None, help="only these, e.g. worker:0 (default every process with a model)")
    p.add_argument("--instance", default=None, help="only the processes of this engine instance (default all)")
    p.add_argument("--top", type=int, default=15, help="modules shown (default %(default)s)")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"give up on the job after this many seconds (default {config.DEFAULT_CAPTURE_TIMEOUT_S:g})")
    p.add_argument("--list", action="store_true", help="list recent module timings instead (GET /modules)")
    p.add_argument("--stop", action="store_true", help="end the running module timing early (POST /modules/stop)")
    p.add_argument("--json", action="store_true", help="print the job's JSON")
    p.set_defaults(handler=_modules)


def describe_modules(job: dict[str, Any], top: int = 15) -> str:
    head = f"module timing {job['id']}: {job['state']}" + (f" ({job['reason']})" if job.get("reason") else "")
    lines = [head]
    if job.get("forward_ms") is None:
        return "\n".join(lines)
    lines[0] += (f", {job['steps']} step{'s' if job['steps'] != 1 else ''}, forward {job['forward_ms_per_step']:.3f} ms/step"
                 f" ({job.get('clock') or 'no'} clock), hooks left: {job.get('hooks_left')}")
    if not job["modules"]:
        lines.append("no module ran during the timed steps")
        return "\n".join(lines)
    lines.append("by module type (self time):")
    rows = [[t["type"], f"{t['calls']:,}", f"{t['self_ms']:.3f}", f"{t['self_share'] * 100:.1f}%",
             f"{t['total_ms']:.3f}"] for t in job["types"]]
    lines.append(table(rows, ["type", "calls", "self ms", "share", "total ms"]))
    lines.append(f"slowest modules (self time, top {top}):")
    ranked = sorted(job["modules"], key=lambda m: (-m["self_ms"], m["path"]))[:top]
    rows = [[m["path"] or "(model)", m["type"], f"{m['calls']:,}", f"{m['self_ms']:.3f}",
             f"{m['self_share'] * 100:.1f}%", f"{m['mean_ms']:.3f}", f"{m['share'] * 100:.1f}%"] for m in ranked]
    lines.append(table(rows, ["module", "type", "calls", "self ms", "self share", "mean ms", "share (total)"]))
    return "\n".join(lines)


@sidecar_command("modules")
def _modules(args: argparse.Namespace, client: SidecarClient) -> int:
    if args.list:
        jobs = client.request("GET", "/modules")["jobs"]
        if args.json:
            print(json.dumps(jobs, indent=1))
        else:
            rows = [[j["id"], j["state"], str(j["steps"]), f"{j['forward_ms_per_step']:.3f}"
                     if j.get("forward_ms_per_step") is not None else "-", j.get("reason") or ""] for j in jobs]
            print(table(rows, ["id", "state", "steps", "forward ms/step", "reason"]) if rows else "no module timings")
        return 0
    if args.stop:
        job = client.request("POST", "/modules/stop")
    elif args.id is not None:
        job = client.modules(args.id)
    else:
        started = client.start_modules(args.steps, delay=args.delay, processes=args.processes,
                                       instance=args.instance, timeout_s=args.timeout)
        progress = Progress()
        try:
            job = client.wait(started["id"], timeout=(args.timeout or config.DEFAULT_CAPTURE_TIMEOUT_S) + 30,
                              on_poll=progress, path="/modules/")
        finally:
            progress.close()
    print(json.dumps(job, indent=1) if args.json else describe_modules(job, args.top))
    return 0 if job["state"] == "done" else EXIT_NOT_DONE
