"""``sidecar fleet capture`` and ``sidecar fleet recorder``: the replicas compared, in one table with
the outlier named (docs/fleet.md, "Compare the replicas").

``capture`` starts the same capture on every replica at about the same moment, under one fleet id
(the ``fleet`` parameter of ``POST /profile/start``), waits for every one, and reads each one's
summary and flight recorder; ``recorder`` reads the flight recorders alone. The figures and the
outlier rule are sidecar/fleet/compare.py's; ``-o FILE`` writes the same table as one HTML page.

The start is best effort: every start request is sent at once (``--concurrency`` at a time), and each
engine begins at its own next working step. The skew reported is the spread of the moments the
captures' first steps began, by each replica's flight recorder (each host's wall clock); where a
recorder does not say, the spread of the moments the sidecars accepted the start, on this machine's
clock (``skew_from``).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from ..common import config
from ..common.verdicts import DONE, FINAL
from ..fleet.compare import MEASURE, OUTLIER_RATIO, capture_row, describe_outlier, outlier, recorder_row, ttft_p99_ms
from ..fleet.fanout import Outcome, run_all, wait_all
from ..fleet.targets import Target
from .client import SidecarClient
from .fleet_common import (Fleet, Progress, add_fleet_args, ask, describe_error, exit_status, failures, print_failed,
                           print_json, ranged, run_fleet)
from .shared import table

MAX_RECORDER_S = 3600.0  # the recorder's own limit (docs/api.md, GET /recorder)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("capture", help="capture N steps on every replica at once, one table, the outlier named")
    add_fleet_args(p)
    p.add_argument("--steps", type=ranged(int, 1, 1000), default=5, help="working steps on every replica (default %(default)s)")
    p.add_argument("--delay", type=ranged(int, 0, 1000), default=None, help="working steps to skip first (default 0)")
    p.add_argument("--processes", default=None, help="only these, e.g. worker, worker:0,engine_core (default all)")
    p.add_argument("--capture-timeout", type=ranged(float, 1, 3600), default=None,
                   help=f"each capture's own limit, the sidecar's timeout_s (default {config.DEFAULT_CAPTURE_TIMEOUT_S:g})")
    p.add_argument("--ttft-seconds", type=ranged(float, 1, MAX_RECORDER_S), default=120.0,
                   help="the TTFT p99 is over the requests of this many seconds before the capture ended (default %(default)s)")
    _compare_args(p)
    p.set_defaults(handler=lambda args: run_fleet(args, "capture", _capture))

    p = sub.add_parser("recorder", help="every replica's flight recorder compared: step time, TTFT, the outlier")
    add_fleet_args(p)
    p.add_argument("--seconds", type=ranged(float, 1, MAX_RECORDER_S), default=120.0, help="how far back (default %(default)s)")
    p.add_argument("--processes", default=None, help="only these, e.g. worker, worker:0,engine_core (default all)")
    _compare_args(p)
    p.set_defaults(handler=lambda args: run_fleet(args, "recorder", _recorder))


def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--outlier-ratio", type=_ratio, default=OUTLIER_RATIO,
                   help="name the replica farthest from the median step time when this many times off (default %(default)s)")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="FILE", help="also write the table as an HTML page")


_ratio = ranged(float, 1.0, 100.0)


def new_fleet_id() -> str:
    """``fleet-<UTC time>-<6 hex>``: sorts by time, as capture ids do, and two fleets never share one."""
    return f"fleet-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def _capture(args: argparse.Namespace, fleet: Fleet) -> int:
    fleet_id = new_fleet_id()
    timeout_s = args.capture_timeout or config.DEFAULT_CAPTURE_TIMEOUT_S
    clients = {t: fleet.client(t) for t in fleet.targets}  # made first: the starts go out together

    def start(target: Target) -> dict[str, Any]:
        sent = time.time()
        started = clients[target].start(args.steps, delay=args.delay, processes=args.processes, timeout_s=timeout_s,
                                        fleet=fleet_id)
        return {"id": started["id"], "accepted_at": (sent + time.time()) / 2}

    errors = lambda exc: describe_error(exc, fleet.timeout)  # noqa: E731
    progress = Progress("capture")
    try:
        starts = run_all(fleet.targets, start, errors, concurrency=fleet.concurrency,
                         on_progress=lambda d, f, n: progress(d, f, n, "started"))
        begun = {o.target: o.result for o in starts if o.ok}

        def poll(target: Target) -> tuple[bool, dict[str, Any]]:
            status = clients[target].status(begun[target]["id"])
            return status["state"] in FINAL, status

        # The sidecar ends each capture at timeout_s; the margin covers its export and analysis.
        ended = wait_all([t for t in fleet.targets if t in begun], poll, errors, deadline_s=timeout_s + 120,
                         concurrency=fleet.concurrency, on_progress=lambda d, f, n: progress(d, f, n, "ended"))
        finished = {o.target: o.result for o in ended if o.ok}
        # Everything recorded since the first start, and at least the TTFT window asked for.
        seconds = min(MAX_RECORDER_S, max(args.ttft_seconds, time.time() - min(
            (b["accepted_at"] for b in begun.values()), default=time.time()) + 5))

        def read(target: Target) -> dict[str, Any]:
            """The replica's row, made on the pool's thread: only the figures outlive the call, so at most
            ``--concurrency`` summaries and recorder answers are held at once, whatever the fleet's size."""
            status, notes = finished[target], []
            summary = recorder = None
            if status.get("summary"):
                try:
                    summary = clients[target].summary(status["id"])
                except Exception as exc:  # the table still shows what the status says
                    notes.append(f"summary: {describe_error(exc, fleet.timeout)}")
            try:
                # As `fleet recorder`: every probe dumps its ring, which takes a moment on a large engine.
                recorder = fleet.client(target, fleet.timeout + 30).request("GET", "/recorder",
                                                                            {"seconds": f"{seconds:.0f}"})
            except Exception as exc:
                notes.append(f"recorder: {describe_error(exc, fleet.timeout)}")
            ttft, count = ttft_p99_ms(recorder)
            return {"target": target.url, "name": target.name or None, **capture_row(status, summary),
                    "ttft_p99_ms": ttft, "ttft_requests": count, "started_ns": _first_step_ns(status, recorder),
                    "accepted_at": round(begun[target]["accepted_at"], 4), "notes": notes}

        reads = run_all([t for t in fleet.targets if t in finished], read, errors, concurrency=fleet.concurrency,
                        on_progress=lambda d, f, n: progress(d, f, n, "read"))
    finally:
        progress.close()

    replicas = [o.result for o in reads if o.ok]
    skew_ms, skew_from = _skew(replicas)
    found = outlier(replicas, args.outlier_ratio)
    answer = {"fleet_id": fleet_id, "steps": args.steps, "skew_ms": skew_ms, "skew_from": skew_from,
              "outlier_ratio": args.outlier_ratio, "replicas": replicas, "outlier": found,
              "failed": failures(fleet, [*starts, *ended, *reads])}
    _report(args, answer, "capture")
    return exit_status(len(replicas), len(answer["failed"]), all(r["state"] == DONE for r in replicas))


def _first_step_ns(status: dict[str, Any], recorder: dict[str, Any] | None) -> int | None:
    """When the capture's first step began on this replica: the earliest start, in the recorder, of a
    process's ``first_step``."""
    if not recorder:
        return None
    first = {p.get("label"): p.get("first_step") for p in status.get("processes", []) if p.get("first_step") is not None}
    starts = [s["start_ns"] for p in recorder.get("processes", []) if isinstance(p.get("process"), dict)
              and p["process"].get("label") in first
              for s in p.get("steps") or [] if s.get("step") == first[p["process"]["label"]] and s.get("working")]
    return min(starts) if starts else None


def _skew(replicas: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """(spread of the starts in ms, what they were measured by)."""
    if len(replicas) < 2:
        return None, None
    firsts = [r["started_ns"] for r in replicas]
    if all(v is not None for v in firsts):
        return round((max(firsts) - min(firsts)) / 1e6, 1), "first_step"
    accepted = [r["accepted_at"] for r in replicas]
    return round((max(accepted) - min(accepted)) * 1000, 1), "start_request"


def _recorder(args: argparse.Namespace, fleet: Fleet) -> int:
    params = {"seconds": f"{args.seconds:g}", **({"processes": args.processes} if args.processes else {})}

    def figures(client: SidecarClient) -> dict[str, Any]:
        # Made on the pool's thread: only the figures outlive the call, not the recorder's rows.
        recorder = client.request("GET", "/recorder", params)
        ttft, count = ttft_p99_ms(recorder)
        return {**recorder_row(recorder), "ttft_p99_ms": ttft, "ttft_requests": count}

    outcomes: list[Outcome] = ask(fleet, "recorder", figures,
                                  timeout=fleet.timeout + 30)  # a recorder of many processes takes a moment to dump
    replicas = [{"target": o.target.url, "name": o.target.name or None, **o.result} for o in outcomes if o.ok]
    answer = {"fleet_id": None, "seconds": args.seconds, "outlier_ratio": args.outlier_ratio, "replicas": replicas,
              "outlier": outlier(replicas, args.outlier_ratio), "failed": failures(fleet, outcomes)}
    _report(args, answer, "recorder")
    return exit_status(len(replicas), len(answer["failed"]))


def _report(args: argparse.Namespace, answer: dict[str, Any], kind: str) -> None:
    if args.output is not None:
        from ..fleet.page import render_fleet_page

        args.output.write_text(render_fleet_page(answer, kind=kind))
        print(f"wrote {args.output}", file=sys.stderr)
    if args.json:
        print_json(answer)
        return
    replicas = answer["replicas"]
    if kind == "capture":
        skew = answer["skew_ms"]
        print(f"fleet {answer['fleet_id']}: {len(replicas)} replica{'s' if len(replicas) != 1 else ''}, "
              f"{answer['steps']} steps each" + ("" if skew is None else f", start skew {skew:.0f} ms"))
        rows = [[_who(r), r["capture"] or "-", r["state"] or "-", _ms(r[MEASURE]),
                 "CPU only" if r["gpu_busy"] is None else f"{r['gpu_busy'] * 100:.1f}%",
                 _short(r["top"]), "-" if r["syncs"] is None else f"{r['syncs']:,}", _ms(r["ttft_p99_ms"])]
                for r in replicas]
        header = ["replica", "capture", "state", "step time", "GPU busy", "top kernel or op", "syncs", "TTFT p99"]
    else:
        print(f"flight recorders, the last {answer['seconds']:g} s: {len(replicas)} replica{'s' if len(replicas) != 1 else ''}")
        rows = [[_who(r), f"{r['steps']:,}", _ms(r[MEASURE]), _ms(r["step_p99_ms"]), _ms(r["slowest_step_ms"]),
                 _ms(r["gc_step_thread_ms"]), "-" if r["requests_finished"] is None else str(r["requests_finished"]),
                 _ms(r["ttft_p99_ms"])] for r in replicas]
        header = ["replica", "steps", "step time", "step p99", "slowest", "GC (step thread)", "requests", "TTFT p99"]
    if rows:
        print(table(rows, header))
    print(describe_outlier(answer["outlier"], sum(1 for r in replicas if r[MEASURE] is not None), args.outlier_ratio))
    for r in replicas:
        for note in r.get("notes") or []:
            print(f"  {_who(r)}: {note}")
    print_failed(answer["failed"])


def _who(r: dict[str, Any]) -> str:
    """A pod's name with its URL; a Prometheus instance or a listed URL is the URL alone."""
    return f"{r['name']} ({r['target']})" if r.get("name") and r["name"] not in r["target"] else r["target"]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def _short(name: str | None, width: int = 48) -> str:
    if not name:
        return "-"
    return name if len(name) <= width else name[: width - 1] + "…"
