"""``sidecar memory``: the CUDA caching allocator's history over N steps in every worker, summarised.

Starts a memory snapshot (``/memory/start``), waits for it and prints, per process, its peak of
allocated and reserved memory, what was live at the peak by allocation site, its fragmentation at the
end and its allocations per step (docs/cli.md); ``--json`` prints the job's JSON; ``-o DIR`` saves each
process's raw snapshot there, for PyTorch's memory viewer (docs/gpu.md). ``sidecar memory ID`` shows a
finished job again.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..common import config
from ..common.protocol import DEFAULT_MEMORY_ENTRIES
from .client import SidecarClient
from .shared import add_connection_args, sidecar_command, table
from .jobs import EXIT_NOT_DONE, Progress


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "memory", help="record the CUDA caching allocator's history for N steps: peak, sites, fragmentation",
        description="Start a memory snapshot (GET /memory/start), wait for it, print each process's peak memory, "
                    "what was live at it by allocation site, fragmentation and allocations per step (docs/api.md, "
                    "Memory snapshot). Exit 0 when done, 1 when it ended otherwise, 2 on an error.")
    add_connection_args(p)
    p.add_argument("id", nargs="?", default=None, help="show this finished job (g...) instead of starting one")
    p.add_argument("--steps", type=int, default=3, help="working steps to record, at most 20 (default %(default)s)")
    p.add_argument("--max-entries", type=int, default=None,
                   help=f"the history's size in alloc/free events (default {DEFAULT_MEMORY_ENTRIES})")
    p.add_argument("--delay", type=int, default=None, help="working steps to skip first (default 0)")
    p.add_argument("--processes", default=None, help="only these, e.g. worker:0 (default every process with CUDA)")
    p.add_argument("--instance", default=None, help="only the processes of this engine instance (default all)")
    p.add_argument("--top", type=int, default=10, help="allocation sites shown per process (default %(default)s)")
    p.add_argument("--timeout", type=float, default=None,
                   help=f"give up on the job after this many seconds (default {config.DEFAULT_CAPTURE_TIMEOUT_S:g})")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="DIR",
                   help="save each process's raw snapshot (a pickle for https://pytorch.org/memory_viz) in DIR")
    p.add_argument("--list", action="store_true", help="list recent memory snapshots instead (GET /memory)")
    p.add_argument("--stop", action="store_true", help="end the running memory snapshot early (POST /memory/stop)")
    p.add_argument("--json", action="store_true", help="print the job's JSON")
    p.set_defaults(handler=_memory)


def _mib(n: Any) -> str:
    return f"{n / 2**20:,.1f} MiB" if isinstance(n, (int, float)) else "-"


def describe_memory(job: dict[str, Any], top: int = 10) -> str:
    head = f"memory snapshot {job['id']}: {job['state']}" + (f" ({job['reason']})" if job.get("reason") else "")
    lines = [head + f", {job['steps']} step{'s' if job['steps'] != 1 else ''}"]
    lines += [f"note: {n}" for n in job.get("notes") or []]
    for p in job.get("processes") or []:
        s = p.get("summary")
        if not s:
            lines.append(f"{p['label']}: {p['state']}" + (f" ({p['error']})" if p.get("error") else ""))
            continue
        peak, frag = s["peak"], s["fragmentation"]
        lines.append(f"{p['label']}: peak {_mib(peak['allocated_bytes'])} allocated, {_mib(peak['reserved_bytes'])} "
                     f"reserved ({peak['at_ms']:g} ms in); at the end {_mib(s['end']['allocated_bytes'])} allocated, "
                     f"{_mib(s['end']['reserved_bytes'])} reserved; {s['allocations']:,} allocations, "
                     f"{s['frees']:,} frees, {s['entries']:,} history entries"
                     + (" (history full: its beginning is lost)" if s.get("truncated") else ""))
        lines.append(f"  fragmentation: {_mib(frag['bytes'])} reserved but not allocated, largest free block "
                     f"{_mib(frag['largest_free_block_bytes'])} of {frag['free_blocks']:,}")
        rows = [[r["site"], _mib(r["bytes"]), f"{r['blocks']:,}"] for r in peak["sites"][:top]]
        if rows:
            lines.append("  live at the peak, by allocation site:")
            lines.append(table(rows, ["site", "bytes", "blocks"]))
        rows = [[str(r["step"]), f"{r['allocations']:,}", f"{r['frees']:,}", _mib(r["peak_allocated_bytes"]),
                 _mib(r["allocated_bytes"])] for r in s.get("steps") or []]
        if rows:
            lines.append(table(rows, ["step", "allocations", "frees", "highest allocated", "allocated at end"]))
        if p.get("download"):
            lines.append(f"  raw snapshot: {p['download']} ({p['bytes']:,} bytes)")
    return "\n".join(lines)


def _save_raw(client: SidecarClient, job: dict[str, Any], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [client.download(p["download"], folder / f"{job['id']}-{p['file']}")
            for p in job.get("processes") or [] if p.get("download")]


@sidecar_command("memory")
def _memory(args: argparse.Namespace, client: SidecarClient) -> int:
    if args.list:
        jobs = client.request("GET", "/memory")["jobs"]
        if args.json:
            print(json.dumps(jobs, indent=1))
        else:
            rows = [[j["id"], j["state"], str(j["steps"]), _mib((j.get("peak") or {}).get("allocated_bytes")),
                     (j.get("peak") or {}).get("process") or "", j.get("reason") or ""] for j in jobs]
            print(table(rows, ["id", "state", "steps", "peak allocated", "in", "reason"]) if rows
                  else "no memory snapshots")
        return 0
    if args.stop:
        job = client.request("POST", "/memory/stop")
    elif args.id is not None:
        job = client.request("GET", f"/memory/{args.id}")
    else:
        params = {"steps": args.steps, "max_entries": args.max_entries, "delay": args.delay,
                  "processes": args.processes, "instance": args.instance, "timeout_s": args.timeout}
        started = client.request("POST", "/memory/start", {k: v for k, v in params.items() if v is not None})
        progress = Progress()
        try:
            job = client.wait(started["id"], timeout=(args.timeout or config.DEFAULT_CAPTURE_TIMEOUT_S) + 30,
                              on_poll=progress, path="/memory/")
        finally:
            progress.close()
    print(json.dumps(job, indent=1) if args.json else describe_memory(job, args.top))
    if args.output is not None and job.get("state") in ("done", "partial"):
        for path in _save_raw(client, job, args.output):
            print(f"saved {path}")
    return 0 if job["state"] == "done" else EXIT_NOT_DONE
