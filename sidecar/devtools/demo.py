"""The demo of ``make demo``, for any engine: its server on a local model, the sidecar, streaming
traffic, a 5-step capture.

Prints what was captured (processes, steps, files), the analysis headline and top operations, and
exits 0 when the capture is complete. ``--model DIR`` points it at any local model directory. An
engine integration runs it with its ``Stack`` subclass (``python -m sidecar_vllm.demo``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..cli.client import SidecarClient, describe
from .stack import Stack
from .traffic import run_load


def main(stack_class: type[Stack], argv: list[str] | None = None, *, prog: str | None = None,
         description: str | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--model", type=Path, default=Path("models/tiny"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--work-dir", type=Path, default=None, help="logs and traces (default: a temporary folder)")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)
    if not (args.model / "config.json").is_file():
        print(f"demo: {args.model} is not a model directory (no config.json); run `make model` or pass --model", file=sys.stderr)
        return 2
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    stack = stack_class(model_dir=args.model.resolve(), work_dir=work.resolve(), dtype=args.dtype)
    print(f"demo: logs and traces in {work}")
    with stack:
        print(f"demo: starting the sidecar and {stack.engine_label} (about 30 s on CPU) ...", flush=True)
        procs = stack.start().wait_for_processes()
        print("demo: engine processes connected: " + ", ".join(p["label"] for p in procs))

        stop_traffic = threading.Event()
        load = {}

        def traffic() -> None:
            async def go():
                while not stop_traffic.is_set():
                    result = await run_load(stack.server_url, stack.served_name, concurrency=4, duration_s=2, max_tokens=32)
                    load.setdefault("requests", 0)
                    load["requests"] += len(result.results)
                    load["failures"] = load.get("failures", 0) + len(result.failures)
            asyncio.run(go())

        thread = threading.Thread(target=traffic, daemon=True)
        thread.start()
        time.sleep(1.0)
        client = SidecarClient(stack.sidecar_url)
        print(f"demo: curl '{stack.sidecar_url}/profile/start?steps={args.steps}'")
        started = client.start(args.steps)
        status = client.wait(started["id"], timeout=120)
        stop_traffic.set()
        thread.join(timeout=30)

        print()
        print(describe(status))
        report = None
        if status.get("summary"):
            from ..analysis import format_report
            from ..report import write_html_report

            summary = client.summary(status["id"])
            print()
            print(format_report(summary))
            # The same as a page to open in a browser, beside the trace it links (docs/report.md).
            report = write_html_report(summary, stack.trace_dir / "captures" / status["id"] / "report.html")
        print(f"\ndemo: {load.get('requests', 0)} streamed requests during the demo, {load.get('failures', 0)} failed")
        print(f"demo: trace files in {stack.trace_dir / 'captures' / status['id']}")
        if report:
            print(f"demo: the capture's report, one HTML page: {report}")
    return 0 if status["state"] == "done" and not load.get("failures") else 1
