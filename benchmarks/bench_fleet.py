"""Issue 31 benchmark: the time of ``sidecar fleet status`` against the number of targets.

Simulated sidecars: tiny aiohttp servers on loopback, all on one event loop of a thread of this
process, each answering the three status endpoints (``/healthz``, ``/processes``, ``/profiles``)
with a sidecar's JSON after ``--latency-ms`` (the network and the sidecar's own time). The command
runs in this process as a user runs it (``sidecar.cli.main``, ``--json``, its output discarded), for
1, 10 and 50 targets at the default concurrency (16), and 50 at concurrency 1 for contrast; each
figure is the median of ``--repeats`` runs. A status is three requests in a row per target, so one
target costs at least 3 × latency; with the pool the whole fleet should cost about
ceil(targets / concurrency) × that, not targets × that.

python benchmarks/bench_fleet.py [--latency-ms 20] [--repeats 3] [--out bench-results/fleet.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from aiohttp import web  # noqa: E402

from sidecar.cli import main as sidecar_main  # noqa: E402

PROCESS = {"label": "worker rank 0 (pid 7022)", "role": "worker", "rank": 0, "pid": 7022, "engine": "vllm",
           "last_step": 1200, "step_rate": 95.0, "stuck": False, "open_step_ms": None}
CAPTURE = {"id": "20261128-120000-abcdef", "state": "done", "steps": 5, "headline": "GPU busy 91.0%"}


class SimulatedFleet:
    """``count`` sidecars on 127.0.0.1, served from one event loop on a thread of their own."""

    def __init__(self, count: int, latency_s: float) -> None:
        self.latency_s = latency_s
        self.urls: list[str] = []
        self._loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self._loop.run_forever, name="simulated-sidecars", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(count), self._loop).result(60)

    async def _start(self, count: int) -> None:
        app = web.Application()

        def answer(body: dict):
            async def handler(request: web.Request) -> web.Response:
                await asyncio.sleep(self.latency_s)
                return web.json_response(body)
            return handler

        app.router.add_get("/healthz", answer({"status": "ok", "version": "0.1.0"}))
        app.router.add_get("/processes", answer({"processes": [PROCESS]}))
        app.router.add_get("/profiles", answer({"captures": [CAPTURE]}))
        for _ in range(count):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
            self._runners.append(runner)
            self.urls.append(f"http://127.0.0.1:{port}")

    def close(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def time_status(urls: list[str], concurrency: int) -> float:
    out = io.StringIO()
    began = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = sidecar_main(["fleet", "status", "--targets", ",".join(urls), "--concurrency", str(concurrency), "--json"])
    elapsed = time.perf_counter() - began
    answered = len(json.loads(out.getvalue())["replicas"])
    if code != 0 or answered != len(urls):
        raise RuntimeError(f"fleet status answered {answered} of {len(urls)} (exit {code})")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=20.0, help="each simulated answer's delay (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    latency = args.latency_ms / 1000
    fleet = SimulatedFleet(50, latency)
    rows = []
    try:
        for count, concurrency in ((1, 16), (10, 16), (50, 16), (50, 1)):
            urls = fleet.urls[:count]
            time_status(urls, concurrency)  # warm: imports, the first connections
            times = [time_status(urls, concurrency) for _ in range(args.repeats)]
            floor = math.ceil(count / concurrency) * 3 * latency
            rows.append({"targets": count, "concurrency": concurrency, "median_s": round(statistics.median(times), 4),
                         "min_s": round(min(times), 4), "floor_s": round(floor, 4),
                         "per_target_ms": round(statistics.median(times) / count * 1000, 2)})
    finally:
        fleet.close()
    print(f"sidecar fleet status, simulated sidecars answering after {args.latency_ms:g} ms "
          f"(median of {args.repeats}; floor: ceil(targets / concurrency) x 3 requests x latency)")
    print(f"{'targets':>7}  {'concurrency':>11}  {'median':>8}  {'min':>8}  {'floor':>8}  {'per target':>10}")
    for r in rows:
        print(f"{r['targets']:>7}  {r['concurrency']:>11}  {r['median_s']:>7.3f}s  {r['min_s']:>7.3f}s  "
              f"{r['floor_s']:>7.3f}s  {r['per_target_ms']:>8.2f}ms")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"latency_ms": args.latency_ms, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
