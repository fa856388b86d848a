"""``sidecar capture``, ``sync``, ``status``, ``list``, ``stop``, ``summary``, ``download``, ``watch``,
``metrics``: the sidecar's jobs and what they found, from a shell.

Each prints a readable table or summary by default and the API's JSON with ``--json``, and exits
non-zero with one line on stderr on any error (shared.run_command). A wait shows its
progress on a terminal (stderr) and nothing extra when piped.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..common import config
from .shared import add_connection_args, sidecar_command, table
from .client import SidecarClient, describe

EXIT_NOT_DONE = 1  # the job ended, but not "done" (partial, failed, cancelled)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("capture", help="record N steps of a running engine through the sidecar and wait for the result",
                              description="Start a capture (GET /profile/start), wait for its verdict, print it. "
                                          "Exit 0 when done, 1 when it ended otherwise, 2 on an error.")
    add_connection_args(p)
    p.add_argument("--steps", type=int, default=5, help="working steps to record in every process (default %(default)s)")
    p.add_argument("--delay", type=int, default=None, help="working steps to skip first (default 0)")
    p.add_argument("--activities", default=None, help="cpu,cuda (default: what the host has)")
    p.add_argument("--processes", default=None, help="only these, e.g. worker, worker:0,engine_core (default all)")
    p.add_argument("--instance", default=None,
                   help="only the processes of this engine instance, as `sidecar status --json` lists it (default all)")
    p.add_argument("--stacks", choices=("none", "sampled", "traced"), default=None,
                   help="Python stacks: sampled on a thread of the probe's own (cheap), or torch's traced stacks "
                        "where the engine allows them (see docs/api.md, Python stacks)")
    p.add_argument("--stack-hz", type=float, default=None, help="sampling rate of sampled stacks (default 1000)")
    p.add_argument("--with-stack", action="store_true", help="the same as --stacks sampled")
    p.add_argument("--record-shapes", action="store_true", help="record each op's input shapes")
    p.add_argument("--profile-memory", action="store_true", help="record tensor allocations and frees")
    p.add_argument("--with-flops", action="store_true", help="estimate the FLOPs of matrix products and convolutions")
    p.add_argument("--with-modules", action="store_true",
                   help="record torch's module hierarchy where the model runs (with its traced stacks): "
                        "the summary's time per module")
    p.add_argument("--nsys", action="store_true",
                   help="backend=nsys: mark the steps for an engine run under `nsys profile "
                        "--capture-range=cudaProfilerApi` (cudaProfilerStart/Stop and NVTX ranges; docs/gpu.md) "
                        "instead of recording a torch.profiler trace")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"give up on the capture after this many seconds (the sidecar's timeout_s; default "
                        f"{config.DEFAULT_CAPTURE_TIMEOUT_S:g})")
    p.add_argument("--output", type=Path, default=None, help="also download the merged trace here")
    p.add_argument("--json", action="store_true", help="print the capture's status JSON")
    p.set_defaults(handler=_capture)

    p = subparsers.add_parser("sync", help="scan N steps for hidden GPU->CPU syncs, wait, print the sites",
                              description="Start a hidden-sync scan (GET /sync/start), wait for it, print its sites "
                                          "(docs/syncs.md). Exit 0 when done, 1 when it ended otherwise, 2 on an error.")
    add_connection_args(p)
    p.add_argument("--steps", type=int, default=5, help="working steps to scan (default %(default)s)")
    p.add_argument("--delay", type=int, default=None, help="working steps to skip first (default 0)")
    p.add_argument("--processes", default=None, help="only these, e.g. worker:0,engine_core (default all step-driven)")
    p.add_argument("--instance", default=None, help="only the processes of this engine instance (default all)")
    p.add_argument("--baseline", default=None, metavar="SCAN_ID", help="mark the sites this earlier scan did not have")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the scan's JSON")
    p.set_defaults(handler=_sync)

    p = subparsers.add_parser("status", help="the engine processes, the running job and the recent captures",
                              description="One look at the sidecar: GET /healthz, /processes, /profiles, /syncs; "
                                          "with an ID, that capture's (or scan's) status.")
    add_connection_args(p)
    p.add_argument("id", nargs="?", default=None, help="a capture id, or a scan id (s...)")
    p.add_argument("--json", action="store_true", help="print the JSON answers")
    p.set_defaults(handler=_status)

    p = subparsers.add_parser("list", help="recent captures and scans, newest first")
    add_connection_args(p)
    p.add_argument("--scans", action="store_true", help="sync scans instead of captures")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(handler=_list)

    p = subparsers.add_parser("summary", help="a finished capture's analysis: the report, or its JSON")
    add_connection_args(p)
    p.add_argument("id", help="the capture id")
    p.add_argument("--json", action="store_true", help="print the summary JSON (schema: docs/analysis.md)")
    p.set_defaults(handler=_summary)

    p = subparsers.add_parser("download", help="a capture's merged trace, or one process's file of it")
    add_connection_args(p)
    p.add_argument("id", help="the capture id")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--file", default=None, metavar="NAME", help="one of the capture's files (`sidecar status ID --json` lists them)")
    what.add_argument("--report", action="store_true",
                      help="the capture's report: one HTML page, as GET /profile/{id}/report serves it (docs/report.md)")
    p.add_argument("-o", "--output", type=Path, required=True,
                   help="write it here (gzip-compressed JSON as served; with --report, HTML)")
    p.set_defaults(handler=_download)

    p = subparsers.add_parser("watch", help="what the always-on sync watch has seen (SIDECAR_SYNC_WATCH=1)")
    add_connection_args(p)
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(handler=_watch)

    p = subparsers.add_parser("metrics", help="the sidecar's Prometheus metrics, as a scrape sees them")
    add_connection_args(p)
    p.add_argument("--grep", default=None, metavar="TEXT", help="only the lines that contain TEXT")
    p.set_defaults(handler=_metrics)

    p = subparsers.add_parser("stop", help="end the running capture (or scan) early, keeping what was recorded")
    add_connection_args(p)
    p.add_argument("--scan", action="store_true", help="stop the running sync scan instead of the capture")
    p.add_argument("--json", action="store_true", help="print the JSON answer")
    p.set_defaults(handler=_stop)


def _print_json(body: Any) -> None:
    print(json.dumps(body, indent=1))


class Progress:
    """One line on a terminal's stderr, rewritten at each poll; nothing when stderr is not a terminal."""

    def __init__(self, stream=None) -> None:
        self._stream = stream if stream is not None else sys.stderr
        self._on = self._stream.isatty()
        self._last = ""
        self._began = time.monotonic()

    def __call__(self, status: dict[str, Any]) -> None:
        if not self._on:
            return
        line = progress_line(status, time.monotonic() - self._began)
        if line != self._last:
            self._stream.write("\r\033[K" + line)
            self._stream.flush()
            self._last = line

    def close(self) -> None:
        if self._on and self._last:
            self._stream.write("\r\033[K")
            self._stream.flush()


def progress_line(status: dict[str, Any], elapsed_s: float) -> str:
    """``capture 2026...: capturing (3.2 s) · worker rank 0 recording 3/5 · engine core exporting``."""
    kind = {"s": "scan", "m": "module timing"}.get(str(status.get("id", ""))[:1], "capture")
    parts = [f"{kind} {status.get('id')}: {status.get('state')} ({elapsed_s:.1f} s)"]
    for p in status.get("processes", []):
        if isinstance(p, str):  # a scan's start answer lists labels only
            continue
        steps = p.get("steps_recorded")
        counted = f" {steps}/{status.get('steps')}" if steps is not None and p.get("role") != "api_server" else ""
        parts.append(f"{p.get('label')} {p.get('state')}{counted}")
    return " · ".join(parts)


@sidecar_command("capture")
def _capture(args: argparse.Namespace, client: SidecarClient) -> int:
    started = client.start(
        args.steps, delay=args.delay, activities=args.activities, processes=args.processes,
        instance=args.instance, with_stack=args.with_stack or None, stacks=args.stacks, stack_hz=args.stack_hz,
        record_shapes=args.record_shapes or None, profile_memory=args.profile_memory or None,
        with_flops=args.with_flops or None, with_modules=args.with_modules or None, timeout_s=args.timeout,
        backend="nsys" if args.nsys else None,
    )
    progress = Progress()
    try:
        # The sidecar ends the capture at timeout_s; the margin covers its export and analysis.
        status = client.wait(started["id"], timeout=(args.timeout or config.DEFAULT_CAPTURE_TIMEOUT_S) + 120,
                             on_poll=progress)
    finally:
        progress.close()
    if args.output and status.get("trace"):
        client.download(status["trace"], args.output)
    _print_json(status) if args.json else print(describe(status))
    return 0 if status["state"] == "done" else EXIT_NOT_DONE


def describe_scan(scan: dict[str, Any]) -> str:
    lines = [f"scan {scan['id']}: {scan['state']}" + (f" ({scan['reason']})" if scan.get("reason") else "")
             + f", {scan.get('hidden', 0)} hidden, {scan.get('expected', 0)} expected"]
    rows = []
    for s in scan.get("sites", []):
        where = f"{s.get('path') or s.get('file')}:{s.get('line')}" if s.get("line") else (s.get("function") or "?")
        new = " new" if scan.get("new_sites") and any(n.get("file") == s.get("file") and n.get("line") == s.get("line")
                                                      for n in scan["new_sites"]) else ""
        rows.append([s["classification"] + new, s["op"], s.get("phase", ""), f"{s['count']:,}",
                     f"{s.get('blocked_us', 0.0):.1f} µs", f"{where} ({s.get('function', '')})"])
    if rows:
        lines.append(table(rows, ["class", "op", "phase", "count", "blocked", "site"]))
    else:
        lines.append("no syncs found")
    return "\n".join(lines)


@sidecar_command("sync")
def _sync(args: argparse.Namespace, client: SidecarClient) -> int:
    params = {k: v for k, v in {"steps": args.steps, "delay": args.delay, "processes": args.processes,
                                "instance": args.instance, "baseline": args.baseline}.items() if v is not None}
    started = client.request("POST", "/sync/start", params)
    progress = Progress()
    try:
        scan = client.wait(started["id"], timeout=args.timeout, on_poll=progress, path="/sync/")
    finally:
        progress.close()
    _print_json(scan) if args.json else print(describe_scan(scan))
    return 0 if scan["state"] == "done" else EXIT_NOT_DONE


@sidecar_command("status")
def _status(args: argparse.Namespace, client: SidecarClient) -> int:
    if args.id:
        kind = "/sync/" if args.id.startswith("s") else "/profile/"
        body = client.request("GET", f"{kind}{args.id}")
        if args.json:
            _print_json(body)
        else:
            print(describe_scan(body) if kind == "/sync/" else describe(body))
        return 0
    health = client.request("GET", "/healthz")
    processes = client.request("GET", "/processes")["processes"]
    captures = client.request("GET", "/profiles")["captures"][:5]
    scans = client.request("GET", "/syncs")["scans"][:3]
    if args.json:
        _print_json({"healthz": health, "processes": processes, "captures": captures, "scans": scans})
        return 0
    print(f"sidecar {client.url}: {health.get('status')}, version {health.get('version')}, "
          f"{len(processes)} engine process{'es' if len(processes) != 1 else ''}")
    if processes:
        rows = [[p["label"], p.get("engine") or "", str(p.get("last_step") if p.get("last_step") is not None else "-"),
                 f"{p['step_rate']:.1f}/s" if p.get("step_rate") else "-",
                 "STUCK" if p.get("stuck") else (f"in a step {p['open_step_ms']:.0f} ms" if p.get("open_step_ms") else "")]
                for p in processes]
        print(table(rows, ["process", "engine", "steps", "rate", "now"]))
    running = [c for c in captures if c["state"] in ("armed", "capturing", "exporting")]
    running += [s for s in scans if s["state"] in ("armed", "scanning")]
    print("running: " + (", ".join(f"{j['id']} ({j['state']})" for j in running) if running else "nothing"))
    if captures:
        print("recent captures:")
        print(table([_capture_row(c) for c in captures], ["id", "state", "steps", "headline"]))
    return 0


def _capture_row(c: dict[str, Any]) -> list[str]:
    return [c["id"], c["state"], str(c.get("steps", "")), (c.get("headline") or c.get("reason") or "")[:100]]


@sidecar_command("list")
def _list(args: argparse.Namespace, client: SidecarClient) -> int:
    if args.scans:
        scans = client.request("GET", "/syncs")["scans"]
        if args.json:
            _print_json({"scans": scans})
        elif not scans:
            print("no scans")
        else:
            print(table([[s["id"], s["state"], str(s.get("steps", "")), str(s.get("hidden", "")), str(s.get("expected", ""))]
                         for s in scans], ["id", "state", "steps", "hidden", "expected"]))
        return 0
    captures = client.request("GET", "/profiles")["captures"]
    if args.json:
        _print_json({"captures": captures})
    elif not captures:
        print("no captures")
    else:
        print(table([_capture_row(c) for c in captures], ["id", "state", "steps", "headline"]))
    return 0


@sidecar_command("stop")
def _stop(args: argparse.Namespace, client: SidecarClient) -> int:
    body = client.request("POST", "/sync/stop" if args.scan else "/profile/stop")
    _print_json(body) if args.json else print(f"{'scan' if args.scan else 'capture'} {body['id']}: {body['state']}")
    return 0


@sidecar_command("summary")
def _summary(args: argparse.Namespace, client: SidecarClient) -> int:
    summary = client.summary(args.id)
    if args.json:
        _print_json(summary)
    else:
        from ..analysis import format_report

        sys.stdout.write(format_report(summary))
    return 0


@sidecar_command("download", timeout=300)
def _download(args: argparse.Namespace, client: SidecarClient) -> int:
    path = (f"/profile/{args.id}/files/{args.file}" if args.file else
            f"/profile/{args.id}/report" if args.report else f"/profile/{args.id}/trace")
    client.download(path, args.output)
    print(f"wrote {args.output} ({args.output.stat().st_size / 1024:.1f} KiB)", file=sys.stderr)
    return 0


@sidecar_command("watch")
def _watch(args: argparse.Namespace, client: SidecarClient) -> int:
    watch = client.request("GET", "/syncs/watch")
    if args.json:
        _print_json(watch)
        return 0
    for p in watch["processes"]:
        why = f" ({p['reason']})" if p.get("reason") else ""
        print(f"{p['process']}: {p['state']}{why}, every {p.get('every', '-')} steps, "
              f"{p.get('sampled_steps', 0):,} sampled")
    if not watch["processes"]:
        print("no engine process reports a sync watch (SIDECAR_SYNC_WATCH=1 in the engine's environment)")
    rows = [[s["classification"], s["op"], s.get("phase", ""), f"{s['count']:,}", f"{s.get('count_per_step', 0):g}",
             f"{s.get('path') or s.get('file')}:{s.get('line')} ({s.get('function', '')})"] for s in watch["sites"]]
    if rows:
        print(table(rows, ["class", "op", "phase", "count", "per step", "site"]))
    return 0


@sidecar_command("metrics")
def _metrics(args: argparse.Namespace, client: SidecarClient) -> int:
    text = client.get_bytes("/metrics").decode()
    lines = [line for line in text.splitlines() if args.grep is None or args.grep in line]
    print("\n".join(lines))
    return 0
