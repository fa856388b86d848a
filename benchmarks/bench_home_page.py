"""Issue 33 benchmark: what the home page's chart costs the engine while it is open and refreshing.

One ``sidecar serve`` and one stand-in engine worker (tests/fake_engine.py: a real probe, ``--step-ms``
of sleep plus a small matrix product per step, every step in its flight recorder). Phases of
``--phase-s`` seconds, in turn, twice over, side by side in one run:

* ``closed``: no page open; nothing asks the recorder.
* ``page``: what an open home page does: ``GET /recorder/timeline?seconds=600&points=300`` every 3 s
  (``--tabs`` of them at once; they share the sidecar's store and its one refresh).
* ``page, steady``: the same phases less their first read (a page that opens reads its window whole,
  once; every later read asks for the rows since the last one).
* ``full``: for contrast, what the page would cost with no store: ``GET /recorder?seconds=600`` every
  3 s, the engine dumping ten minutes of its ring each time.

Afterwards one ``GET /recorder`` reads the engine's own record of its steps, and for each mode this
prints the step time (median, p99, p99.9, max, from the steps that began in its phases), the engine
process's CPU and the sidecar's CPU (psutil, in % of one core), and the ratios of the p99 and max step
time to the closed phases'. The stall a read causes is on the engine's side: its dump thread holds
the GIL while it copies and writes rows, which the step thread waits for.

python benchmarks/bench_home_page.py [--phase-s 20] [--tabs 1] [--step-ms 2] [--out bench-results/home_page.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
FAKE_ENGINE = ROOT / "tests" / "fake_engine.py"
REFRESH_S = 3.0  # the page script's REFRESH_MS
MODES = ("closed", "page", "full")

from bench_store import _start_sidecar  # noqa: E402 (the same way to start a sidecar)


def _get(url: str, token: str) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def _poll(url: str, token: str, stop: threading.Event, errors: list[str]) -> None:
    """One tab: a read every REFRESH_S, as the page script's loop (the next one 3 s after the answer)."""
    while not stop.is_set():
        try:
            _get(url, token)
        except Exception as exc:  # noqa: BLE001 (counted: a 429 would be the store failing to share)
            errors.append(str(exc))
        stop.wait(REFRESH_S)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase-s", type=float, default=20.0, help="seconds of each phase (default %(default)s)")
    parser.add_argument("--tabs", type=int, default=1, help="pages open at once in the page phases")
    parser.add_argument("--step-ms", type=float, default=2.0, help="the stand-in engine's sleep per step")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "home_page.json")
    args = parser.parse_args(argv)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins"), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory(prefix="bench-home-page-") as tmp:
        work = Path(tmp)
        sidecar, url, token = _start_sidecar(work, env, [])
        engine = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "worker", "--rank", "0", "--step-ms", str(args.step_ms)],
                                  env={**env, "SIDECAR_ENDPOINT": url, "SIDECAR_TOKEN": token, "OMP_NUM_THREADS": "1",
                                       "SIDECAR_TRACE_DIR": str(work / "probe-root"), "SIDECAR_TOKEN_FILE": str(work / "none")},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while not [p for p in _get(f"{url}/processes", token)["processes"] if p.get("step_rate")]:
                if time.monotonic() > deadline:
                    raise SystemExit("the stand-in engine did not connect")
                time.sleep(0.2)
            time.sleep(3.0)  # the ring holds some steps before the first read
            procs = {"engine": psutil.Process(engine.pid), "sidecar": psutil.Process(sidecar.pid)}
            targets = {"page": f"{url}/recorder/timeline?seconds=600&points=300", "full": f"{url}/recorder?seconds=600"}
            phases, errors = [], []
            for mode in MODES * 2:
                stop = threading.Event()
                tabs = [threading.Thread(target=_poll, args=(targets[mode], token, stop, errors), daemon=True)
                        for _ in range(args.tabs if mode in targets else 0)]
                cpu0 = {k: sum(p.cpu_times()[:2]) for k, p in procs.items()}
                t0 = time.time_ns()
                for tab in tabs:
                    tab.start()
                time.sleep(args.phase_s)
                stop.set()
                for tab in tabs:
                    tab.join()
                t1 = time.time_ns()
                cpu = {k: (sum(p.cpu_times()[:2]) - cpu0[k]) / ((t1 - t0) / 1e9) * 100 for k, p in procs.items()}
                phases.append({"mode": mode, "since_ns": t0, "until_ns": t1, "cpu": cpu})
                print(f"  phase {mode:6s} {args.phase_s:.0f} s: engine CPU {cpu['engine']:.1f} %, "
                      f"sidecar CPU {cpu['sidecar']:.1f} %", flush=True)
            seconds = (time.time_ns() - phases[0]["since_ns"]) / 1e9 + 5
            steps = _get(f"{url}/recorder?seconds={min(3600, seconds):.0f}", token)["processes"][0]["steps"]
        finally:
            engine.kill()
            engine.wait()
            sidecar.terminate()
            sidecar.wait(20)
    result = {"phase_s": args.phase_s, "tabs": args.tabs, "step_ms": args.step_ms, "errors": errors[:5], "modes": {}}
    # "page, steady": the page phases less their first read (a page opening reads its window whole, once).
    for mode, skip_s in (*((m, 0.0) for m in MODES), ("page, steady", REFRESH_S + 1)):
        mine = [p for p in phases if p["mode"] == mode.split(",")[0]]
        durations = [s["duration_ms"] for s in steps if s["working"]
                     and any(p["since_ns"] + skip_s * 1e9 <= s["start_ns"] < p["until_ns"] for p in mine)]
        if not durations:
            raise SystemExit(f"no step recorded in the {mode} phases (the ring is too small for the run?)")
        result["modes"][mode] = {
            "steps": len(durations), "median_ms": statistics.median(durations),
            "p99_ms": _percentile(durations, 0.99), "p999_ms": _percentile(durations, 0.999), "max_ms": max(durations),
            "engine_cpu_pct": statistics.mean(p["cpu"]["engine"] for p in mine),
            "sidecar_cpu_pct": statistics.mean(p["cpu"]["sidecar"] for p in mine)}
    closed = result["modes"]["closed"]
    for mode, r in result["modes"].items():
        print(f"{mode:12s}: {r['steps']} steps, median {r['median_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, "
              f"p99.9 {r['p999_ms']:.3f} ms, max {r['max_ms']:.3f} ms; engine CPU {r['engine_cpu_pct']:.1f} %, "
              f"sidecar CPU {r['sidecar_cpu_pct']:.1f} %")
    for mode in ("page", "page, steady", "full"):
        r = result["modes"][mode]
        r["p99_ratio"] = r["p99_ms"] / closed["p99_ms"]
        r["max_ratio"] = r["max_ms"] / closed["max_ms"]
        print(f"{mode} / closed: p99 step time x{r['p99_ratio']:.3f}, max x{r['max_ratio']:.3f}, "
              f"engine CPU {r['engine_cpu_pct'] - closed['engine_cpu_pct']:+.1f} points")
    if errors:
        print(f"{len(errors)} reads failed, e.g. {errors[0]}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
