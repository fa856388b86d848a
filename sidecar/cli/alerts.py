"""``sidecar alerts``: what the sidecar did with Alertmanager's alerts (``GET /alerts``), and
``--send FILE`` to hand it a webhook notification as Alertmanager would (``POST /alerts``): a way to
try an ``--alert-actions`` file before a real alert does. docs/api.md, "Alerts"."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .client import SidecarClient
from .shared import add_connection_args, sidecar_command, table


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("alerts", help="the Alertmanager alerts the sidecar fired on or skipped, and its actions")
    add_connection_args(p)
    p.add_argument("--send", type=Path, metavar="FILE",
                   help="POST this webhook notification (Alertmanager's JSON, version 4) and print what became of each alert")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(handler=_alerts)


@sidecar_command("alerts")
def _alerts(args: argparse.Namespace, client: SidecarClient) -> int:
    if args.send is not None:
        try:
            body = json.loads(args.send.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"sidecar alerts: {args.send}: {exc}", file=sys.stderr)
            return 2
        answer = json.loads(client.call("POST", "/alerts", body=body))
        if args.json:
            print(json.dumps(answer, indent=1))
        else:
            print(f"{answer['received']} alerts: {answer['fired']} fired, {answer['skipped']} skipped")
            print(table([[a["name"], a["fingerprint"], a["outcome"], a["firing"] or a["reason"] or ""]
                         for a in answer["alerts"]], ["alert", "fingerprint", "outcome", "firing / reason"]))
        return 0
    listed = client.request("GET", "/alerts")
    if args.json:
        print(json.dumps(listed, indent=1))
    else:
        _print(listed)
    return 0


def _print(listed: dict[str, Any]) -> None:
    actions = listed["actions"]
    print(f"{len(actions)} alert actions" + ("" if actions else " (sidecar serve --alert-actions FILE): every alert is skipped"))
    for i, a in enumerate(actions):
        match = ", ".join(f"{k}={v}" for k, v in a["match"].items()) or "every alert"
        print(f"  [{i}] {match}: {a['action']}, cooldown {a['cooldown_s']:g} s, {a['fired_last_hour']}/"
              f"{a['budget_per_hour']} fired in the last hour")
    print("counts: " + ", ".join(f"{k} {v}" for k, v in listed["counts"].items()))
    for f in listed["firings"]:
        print(f"  fired {f['id']}: {f['alert']['name']} -> capture {f['capture'] or f['capture_skipped']}")
    for s in listed["skipped"]:
        times = f" x{s['times']}" if s["times"] > 1 else ""
        print(f"  skipped {s['alert']['name']}{times}: {s['reason']}" + (f" ({s['detail']})" if s["detail"] else ""))
