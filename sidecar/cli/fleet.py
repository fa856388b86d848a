"""``sidecar fleet status|capture|recorder|stacks|requests|triggers``: one of today's commands on many
sidecars at once (docs/fleet.md).

The sidecars are found through a Prometheus scrape job, a Kubernetes label selector or a list
(sidecar/fleet: targets, prometheus, k8s); each is asked through the same client as every other
command (client.py), at most ``--concurrency`` at a time, each request bounded by ``--timeout``
(fleet/fanout.py). A target that fails is named with one line in the answer's ``failed``; the others
answer. Exit status: 0 every target answered (and, for ``capture``, every capture is ``done``), 1 a
partial answer, 2 none, or bad arguments, or no targets found.

This module registers the commands and holds those that only gather answers; what they share
(arguments, discovery, clients, failures) is fleet_common.py, and the commands that compare the
replicas (``capture``, ``recorder``) are fleet_compare.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .client import SidecarClient
from .fleet_common import Fleet, TargetError, add_fleet_args, ask, finish, ranged, replica, run_fleet
from .shared import table


def register(subparsers: argparse._SubParsersAction) -> None:
    from . import fleet_compare

    fleet = subparsers.add_parser("fleet", help="one command on many sidecars at once: status, capture, recorder, ...",
                                  description="Run a command on every sidecar of a Prometheus job, a Kubernetes "
                                              "selector or a list (docs/fleet.md). Exit 0 when every target answered, "
                                              "1 when some did not, 2 when none did or on bad arguments.")
    sub = fleet.add_subparsers(dest="fleet_command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("status", help="every sidecar's health, engine processes, running job, last capture")
    add_fleet_args(p)
    p.set_defaults(handler=lambda args: run_fleet(args, "status", _status))

    fleet_compare.register(sub)

    p = sub.add_parser("stacks", help="every thread's Python stack in every engine process of every sidecar")
    add_fleet_args(p)
    p.add_argument("--seconds", type=ranged(float, 0.01, 60), default=None, help="sample this long instead of one snapshot")
    p.add_argument("--hz", type=float, default=None, help="sampling rate (default 100)")
    p.add_argument("--threads", choices=("all", "step"), default=None)
    p.add_argument("--processes", default=None, help="only these, e.g. worker, worker:0,engine_core")
    p.set_defaults(handler=lambda args: run_fleet(args, "stacks", _stacks))

    p = sub.add_parser("requests", help="the requests in flight on every sidecar's engine")
    add_fleet_args(p)
    p.set_defaults(handler=lambda args: run_fleet(args, "requests", _requests))

    p = sub.add_parser("triggers", help="list, add or delete trigger rules on every sidecar")
    add_fleet_args(p)
    action = p.add_mutually_exclusive_group()
    action.add_argument("--add", type=Path, metavar="FILE", help="add the rules in FILE (one JSON rule, or a list)")
    action.add_argument("--delete", metavar="ID", help="delete this trigger on every sidecar that has it")
    p.set_defaults(handler=lambda args: run_fleet(args, "triggers", _triggers))


# -- the commands that gather answers -----------------------------------------------------------------------

def _status(args: argparse.Namespace, fleet: Fleet) -> int:
    def call(client: SidecarClient) -> dict[str, Any]:
        return {"healthz": client.request("GET", "/healthz"), "processes": client.request("GET", "/processes")["processes"],
                "captures": client.request("GET", "/profiles")["captures"][:3]}

    outcomes = ask(fleet, "status", call)
    replicas = [replica(o.target, **o.result) for o in outcomes if o.ok]

    def text() -> None:
        rows = []
        for r in replicas:
            procs = r["processes"]
            rate = max((p.get("step_rate") or 0.0 for p in procs), default=0.0)
            running = [c for c in r["captures"] if c.get("state") in ("armed", "capturing", "exporting")]
            last = r["captures"][0] if r["captures"] else None
            stuck = sum(1 for p in procs if p.get("stuck"))
            rows.append([r["name"] or r["target"], str(r["healthz"].get("status")), str(r["healthz"].get("version")),
                         str(len(procs)) + (f" ({stuck} stuck)" if stuck else ""), f"{rate:.1f}/s" if rate else "-",
                         running[0]["id"] if running else "-",
                         f"{last['id']} {last['state']}" if last else "-"])
        if rows:
            print(table(rows, ["target", "health", "version", "processes", "steps", "running", "last capture"]))

    return finish(args, fleet, outcomes, replicas, text)


def _stacks(args: argparse.Namespace, fleet: Fleet) -> int:
    params = {k: v for k, v in {"seconds": args.seconds, "hz": args.hz, "threads": args.threads,
                                "processes": args.processes, "format": "json" if args.json else "text"}.items()
              if v is not None}
    timeout = fleet.timeout + (args.seconds or 0)  # a sample takes the seconds asked for
    if args.json:
        outcomes = ask(fleet, "stacks", lambda c: c.request("GET", "/stacks", params), timeout)
    else:
        outcomes = ask(fleet, "stacks", lambda c: c.get_bytes("/stacks", params).decode(errors="replace"), timeout)
    replicas = [replica(o.target, stacks=o.result) for o in outcomes if o.ok]

    def text() -> None:
        for r in replicas:
            print(f"===== {r['name'] or r['target']}" + (f" ({r['target']})" if r["name"] else ""))
            print(r["stacks"].rstrip("\n"))

    return finish(args, fleet, outcomes, replicas, text)


def _requests(args: argparse.Namespace, fleet: Fleet) -> int:
    outcomes = ask(fleet, "requests", lambda c: c.request("GET", "/requests"))
    replicas = [replica(o.target, **o.result) for o in outcomes if o.ok]

    def text() -> None:
        rows = [[r["name"] or r["target"], str(r.get("count", 0)),
                 f"{r['oldest_age_s']:.1f} s" if r.get("oldest_age_s") is not None else "-",
                 ", ".join(f"{p['process']}: {p['error']}" for p in r.get("processes", []) if p.get("error"))]
                for r in replicas]
        if rows:
            print(table(rows, ["target", "in flight", "oldest", "errors"]))

    return finish(args, fleet, outcomes, replicas, text)


def _triggers(args: argparse.Namespace, fleet: Fleet) -> int:
    if args.add is not None:
        try:
            rules = json.loads(args.add.read_text())
        except (OSError, ValueError) as exc:
            raise TargetError(f"{args.add}: {getattr(exc, 'strerror', None) or exc}") from None
        rules = rules if isinstance(rules, list) else [rules]

        def call(client: SidecarClient) -> dict[str, Any]:
            return {"added": [json.loads(client.call("POST", "/triggers", body=rule)) for rule in rules]}
    elif args.delete is not None:
        def call(client: SidecarClient) -> dict[str, Any]:
            return {"deleted": json.loads(client.call("DELETE", f"/triggers/{args.delete}") or b"{}")}
    else:
        def call(client: SidecarClient) -> dict[str, Any]:
            return {"triggers": client.request("GET", "/triggers")["triggers"]}

    outcomes = ask(fleet, "triggers", call)
    replicas = [replica(o.target, **o.result) for o in outcomes if o.ok]

    def text() -> None:
        for r in replicas:
            who = r["name"] or r["target"]
            if "added" in r:
                print(f"{who}: added " + ", ".join(f"{t['id']} ({t['rule']['name']})" for t in r["added"]))
            elif "deleted" in r:
                print(f"{who}: deleted {args.delete}")
            else:
                print(f"{who}: {len(r['triggers'])} triggers" + "".join(
                    f"\n  {t['id']}  {t['rule']['name']}  fired {t.get('counts', {}).get('fired', 0)}"
                    for t in r["triggers"]))

    return finish(args, fleet, outcomes, replicas, text)
