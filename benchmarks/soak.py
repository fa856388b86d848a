"""Issue 10 soak: the sidecar beside real vLLM under continuous traffic for N minutes.

Not part of ``make test`` or ``make bench``: ``make soak`` (``SOAK_MINUTES ?= 30``) runs it.

What runs, all at once, on the tiny local model (float32):
  traffic    ``--clients`` (4) streaming clients back to back, ``--max-tokens`` (48) each, for the
             whole run, across sidecar restarts (the engine serves whether the sidecar is up or not)
  captures   a ``--capture-steps`` (5) step capture every ``--capture-every-min`` (1), 15 s into each
             minute, waited for until it reaches a final state
  scans      a ``--scan-steps`` (5) step sync scan every minute, 30 s after each capture
  restarts   the sidecar stopped and started again every ``--restart-every-min`` (10), alternately
             with SIGTERM and SIGKILL (``--restart-kind``); the engine's probes reconnect by themselves
Captures, scans and restarts run one after another on one thread, so none of them overlaps another
(a restart never cuts a capture short: a capture interrupted that way is a fault of its own, listed
as failed after the restart, docs/api.md).

Every ``--sample-every-s`` (15) a sampler thread records: RSS and open file descriptors of the
sidecar, of each engine process (API server, engine core, worker: pids from ``GET /processes``,
read again at every sample, so the ones after a restart too) and of this driver; bytes under the
trace dir and the number of capture folders; requests done and failed so far; captures and scans by
outcome. At the end: a table over time, a verdict, and the whole time series as JSON in
``bench-results/soak-<timestamp>.json``.

Exit status 1 when a request failed, a capture or scan did not reach a final state within its
timeout (or could not be started), a restart did not bring the sidecar back with every engine
process connected, an engine process changed pid (it restarted), the trace dir kept more capture
folders than ``--keep``, or a process's fd count rose monotonically by more than ``--fd-threshold``
(see ``fd_leaks``). Tracebacks and ERROR lines in the logs, RSS growth over ``--rss-warn-mib`` and an
unclean SIGTERM exit are warnings.

python benchmarks/soak.py [--minutes 30] [--restart-every-min 10] [--model models/tiny] [--keep 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "plugins")]

from sidecar.cli.client import SidecarClient, SidecarError  # noqa: E402
from sidecar.cli.make_model import build_model  # noqa: E402
from sidecar.devtools.traffic import PROMPTS, stream_one  # noqa: E402
from sidecar.common.verdicts import FINAL  # noqa: E402
from sidecar_vllm.devtools import VllmStack  # noqa: E402

from soak_report import dir_usage, row_cells, table, verdict  # noqa: E402



# --------------------------------------------------------------------------------------------------
# Traffic: streaming clients in a thread of their own, counting as they go (nothing kept per request,
# so the driver's own memory stays flat however long it runs).

class Traffic:
    def __init__(self, url: str, model: str, clients: int, max_tokens: int) -> None:
        self.url, self.model, self.clients, self.max_tokens = url, model, clients, max_tokens
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self.done = self.failed = self.tokens = 0
        self.errors: list[dict] = []  # the first 20 failures, with when they happened
        self._window = self._fresh_window()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), name="soak-traffic", daemon=True)

    @staticmethod
    def _fresh_window() -> dict:
        return {"requests": 0, "gaps": 0, "gap_sum": 0.0, "max_gap": 0.0, "ttft_sum": 0.0}

    async def _main(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            await asyncio.gather(*(self._client(n, session) for n in range(self.clients)))

    async def _client(self, n: int, session: aiohttp.ClientSession) -> None:
        i = 0
        while not self.stop.is_set():
            r = await stream_one(session, self.url, self.model, PROMPTS[(n + i) % len(PROMPTS)], self.max_tokens)
            i += 1
            with self._lock:
                if r.ok:
                    self.done += 1
                    self.tokens += r.tokens
                    w = self._window
                    w["requests"] += 1
                    w["gaps"] += len(r.gaps_s)
                    w["gap_sum"] += sum(r.gaps_s)
                    w["max_gap"] = max([w["max_gap"], *r.gaps_s])
                    w["ttft_sum"] += r.ttft_s
                else:
                    self.failed += 1
                    if len(self.errors) < 20:
                        self.errors.append({"at": time.time(), "error": r.error})
            if not r.ok:
                await asyncio.sleep(0.5)  # a server that refuses must not be hammered in a tight loop

    def snapshot(self) -> dict:
        """Totals so far, and the latency of the requests finished since the last snapshot."""
        with self._lock:
            w, self._window = self._window, self._fresh_window()
            return {
                "requests_done": self.done, "requests_failed": self.failed, "tokens": self.tokens,
                "window_requests": w["requests"],
                "window_mean_itl_ms": round(w["gap_sum"] / w["gaps"] * 1e3, 2) if w["gaps"] else None,
                "window_max_gap_ms": round(w["max_gap"] * 1e3, 1),
                "window_mean_ttft_ms": round(w["ttft_sum"] / w["requests"] * 1e3, 1) if w["requests"] else None,
            }

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout: float = 330) -> None:
        """Stop sending; the requests in flight finish (and are counted)."""
        self.stop.set()
        self._thread.join(timeout)


# --------------------------------------------------------------------------------------------------
# Sampling

def proc_stats(pid: int | None) -> dict | None:
    if pid is None:
        return None
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return {"pid": pid, "rss": p.memory_info().rss, "fds": p.num_fds(), "threads": p.num_threads()}
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


class Soak:
    def __init__(self, stack: VllmStack, args: argparse.Namespace) -> None:
        self.stack, self.args = stack, args
        self.client = SidecarClient(stack.sidecar_url, timeout=10)
        self.traffic = Traffic(stack.server_url, stack.served_name, args.clients, args.max_tokens)
        self.t0 = 0.0
        self.samples: list[dict] = []
        self.captures: list[dict] = []
        self.scans: list[dict] = []
        self.restarts: list[dict] = []
        self.engine_pids: dict[str, int] = {}  # "engine_core" / "worker:0" ... -> pid, as last read
        self.pid_changes: list[dict] = []  # an engine process whose pid changed: it was restarted
        self.largest_capture_bytes = 0
        self.log_bytes: dict[str, int] = {}  # how far each log had come when the run ended
        self._lock = threading.Lock()
        self._stop_sampling = threading.Event()
        self._restarting = threading.Event()  # no sidecar sample while it stops and starts

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    # --- the sampler thread -----------------------------------------------------------------------

    def _read_engine_pids(self) -> dict[str, dict]:
        steps: dict[str, dict] = {}
        try:
            procs = self.client.request("GET", "/processes")["processes"]
        except (OSError, SidecarError, ValueError, KeyError):
            return steps  # the sidecar is restarting: keep the pids read last
        for p in procs:
            key = p["role"] if p["role"] != "worker" else f"worker:{p.get('rank') or 0}"
            old = self.engine_pids.get(key)
            if old is not None and old != p["pid"]:
                self.pid_changes.append({"t": round(self.elapsed(), 1), "process": key, "old": old, "new": p["pid"]})
            self.engine_pids[key] = p["pid"]
            steps[key] = {"last_step": p.get("last_step"), "step_rate": p.get("step_rate")}
        return steps

    def sample(self) -> dict:
        steps = self._read_engine_pids()
        sidecar = None if self._restarting.is_set() else self.stack._sidecar  # the Popen of the sidecar now
        procs = {"sidecar": proc_stats(sidecar.pid if sidecar and sidecar.poll() is None else None),
                 "driver": proc_stats(os.getpid())}
        for key, pid in sorted(self.engine_pids.items()):
            stats = proc_stats(pid)
            if stats is not None:
                stats.update(steps.get(key, {}))
            procs[key] = stats
        disk, folders, scans_saved = dir_usage(self.stack.trace_dir)
        with self._lock:
            jobs = {"captures": dict(Counter(c["outcome"] for c in self.captures)),
                    "scans": dict(Counter(s["outcome"] for s in self.scans)),
                    "restarts": len(self.restarts)}
        s = {"t": round(self.elapsed(), 1), "at": time.time(), "processes": procs, "disk_bytes": disk,
             "capture_folders": folders, "scans_saved": scans_saved, **self.traffic.snapshot(), **jobs}
        self.samples.append(s)
        return s

    def _sampler(self) -> None:
        n = 0
        while not self._stop_sampling.is_set():
            try:
                s = self.sample()
                if self.args.verbose:
                    print(f"soak: t={s['t']:7.1f}s  " + row_cells(s, self.proc_keys()), flush=True)
            except Exception as exc:  # a sample must never end the soak; say so and go on
                print(f"soak: sample failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            n += 1
            self._stop_sampling.wait(max(0.0, self.t0 + n * self.args.sample_every_s - time.monotonic()))

    def proc_keys(self) -> list[str]:
        order = ("api_server", "engine_core", "worker")
        role_rank = lambda k: (order.index(k.split(":")[0]) if k.split(":")[0] in order else len(order), k)  # noqa: E731
        engine = sorted({k for s in self.samples for k in s["processes"]} - {"sidecar", "driver"}, key=role_rank)
        return ["sidecar", *engine, "driver"]

    # --- captures, scans, restarts (one thread, one after another) --------------------------------

    def _wait_job(self, path: str, job_id: str, timeout: float) -> dict | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                status = self.client.request("GET", f"{path}/{job_id}")
                if status["state"] in FINAL:
                    return status
            except (OSError, SidecarError, ValueError):
                pass
            time.sleep(0.5)
        return None

    def _job(self, kind: str) -> dict:
        a = self.args
        start_path, path, steps = (("/profile/start", "/profile", a.capture_steps) if kind == "capture"
                                   else ("/sync/start", "/sync", a.scan_steps))
        sidecar = self.stack._sidecar
        rec: dict = {"t": round(self.elapsed(), 1), "id": None, "outcome": None, "state": None, "reason": None,
                     "sidecar_pid": sidecar.pid if sidecar else None}
        began = time.monotonic()
        try:
            started = self.client.request("POST", start_path, {"steps": steps, "timeout_s": a.job_timeout_s})
            rec["id"] = started["id"]
        except (OSError, SidecarError, ValueError, KeyError) as exc:
            rec.update(outcome="start_error", reason=f"{type(exc).__name__}: {exc}")
            return rec
        # The sidecar gives up waiting for steps after timeout_s; the verdict follows within seconds
        # (export, merge, analysis). Past that margin the job is stuck: that is a failure of the soak.
        status = self._wait_job(path, rec["id"], a.job_timeout_s + 60)
        rec["seconds"] = round(time.monotonic() - began, 2)
        if status is None:
            rec.update(outcome="timeout", reason=f"no final state after {a.job_timeout_s + 60:.0f} s")
            try:  # let the next job start
                self.client.request("POST", f"{'/profile' if kind == 'capture' else '/sync'}/stop")
            except (OSError, SidecarError, ValueError):
                pass
            return rec
        rec.update(outcome=status["state"], state=status["state"], reason=status.get("reason"),
                   processes=[f"{p['label']}: {p['state']}" + (f" ({p['error']})" if p.get("error") else "")
                              for p in status.get("processes", [])])
        if kind == "capture":
            rec["trace_bytes"] = status.get("trace_bytes")
            folder = self.stack.trace_dir / "captures" / rec["id"]
            rec["folder_bytes"] = dir_usage(folder)[0] if folder.exists() else 0
            self.largest_capture_bytes = max(self.largest_capture_bytes, rec["folder_bytes"])
        else:
            rec["hidden"], rec["expected"] = status.get("hidden"), status.get("expected")
        return rec

    def _restart(self, kill: bool) -> dict:
        rec: dict = {"t": round(self.elapsed(), 1), "signal": "SIGKILL" if kill else "SIGTERM", "ok": False}
        old = self.stack._sidecar
        rec["old_pid"] = old.pid if old else None
        began = time.monotonic()
        self._restarting.set()
        self.stack.stop_sidecar(kill=kill)
        rec["stop_s"] = round(time.monotonic() - began, 2)
        # SIGTERM: 0 is a clean shutdown, -9 means it did not exit within 20 s and was killed.
        rec["exit_code"] = old.returncode if old else None
        try:
            self.stack.start_sidecar()
            rec["new_pid"] = self.stack._sidecar.pid
            rec["up_s"] = round(time.monotonic() - began, 2)  # answering /healthz
            self.stack.wait_for_processes(timeout=60)
            rec["ok"] = True
        except (RuntimeError, TimeoutError) as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            self._restarting.clear()
        rec["back_s"] = round(time.monotonic() - began, 2)
        return rec

    def schedule(self) -> list[tuple[float, str]]:
        a, end = self.args, self.args.minutes * 60
        events: list[tuple[float, str]] = []
        if a.traffic_only:
            return events
        k = 0
        while (t := k * a.capture_every_min * 60 + 15) < end:
            events += [(t, "capture")]
            if t + 30 < end:
                events += [(t + 30, "scan")]
            k += 1
        m = 1
        while (t := m * a.restart_every_min * 60) < end - 5:
            events.append((t, "restart"))
            m += 1
        return sorted(events)

    def run(self) -> None:
        a = self.args
        self.t0 = time.monotonic()
        self.traffic.start()
        sampler = threading.Thread(target=self._sampler, name="soak-sampler", daemon=True)
        sampler.start()
        end = a.minutes * 60
        try:
            for at, what in self.schedule():
                delay = self.t0 + at - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                if self.elapsed() >= end:
                    break
                if what == "restart":
                    kill = {"term": False, "kill": True, "alternate": len(self.restarts) % 2 == 1}[a.restart_kind]
                    rec = self._restart(kill)
                    with self._lock:
                        self.restarts.append(rec)
                    print(f"soak: t={rec['t']:7.1f}s restart ({rec['signal']}): stopped in {rec['stop_s']} s "
                          f"(exit {rec['exit_code']}), serving after {rec.get('up_s')} s, every engine process back after {rec['back_s']} s"
                          + ("" if rec["ok"] else f"  FAILED: {rec.get('error')}"), flush=True)
                else:
                    rec = self._job(what)
                    with self._lock:
                        (self.captures if what == "capture" else self.scans).append(rec)
                    print(f"soak: t={rec['t']:7.1f}s {what} {rec['id']}: {rec['outcome']}"
                          + (f" in {rec['seconds']} s" if "seconds" in rec else "")
                          + (f" ({rec['reason']})" if rec["reason"] else ""), flush=True)
            remaining = self.t0 + end - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        finally:
            self._stop_sampling.set()
            sampler.join(timeout=60)
            if not self.samples or self.elapsed() - self.samples[-1]["t"] > 2:
                self.sample()  # the last sample, at the end, with the load still on
            self.traffic.finish()
            # What the logs say from here on is the stack being shut down (vLLM logs its engine's
            # death as an ERROR with a traceback when it is stopped): not part of the verdict.
            for name in ("sidecar.log", self.stack.log_name):
                try:
                    self.log_bytes[name] = (self.stack.work_dir / name).stat().st_size
                except FileNotFoundError:
                    pass
        self.final_traffic = self.traffic.snapshot()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--model", type=Path, default=ROOT / "models" / "tiny")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--capture-steps", type=int, default=5)
    p.add_argument("--scan-steps", type=int, default=5)
    p.add_argument("--capture-every-min", type=float, default=1.0, help="a capture this often, a scan 30 s after each")
    p.add_argument("--restart-every-min", type=float, default=10.0)
    p.add_argument("--restart-kind", choices=("alternate", "term", "kill"), default="alternate",
                   help="alternate: SIGTERM first, then SIGKILL, and so on")
    p.add_argument("--job-timeout-s", type=float, default=60.0, help="timeout_s of each capture and scan")
    p.add_argument("--sample-every-s", type=float, default=15.0)
    p.add_argument("--warmup-s", type=float, default=60.0, help="growth is measured from the first sample after this")
    p.add_argument("--keep", type=int, default=10, help="the sidecar's --keep (captures and scans kept on disk)")
    p.add_argument("--fd-threshold", type=int, default=20, help="fail when an fd count only rose, by more than this")
    p.add_argument("--rss-warn-mib", type=float, default=50.0, help="warn when a process's RSS grew more than this after warm-up")
    p.add_argument("--table-every-min", type=float, default=None, help="rows of the table (default 5, or 1 under 15 minutes)")
    p.add_argument("--scan-cpu-as-device", type=int, choices=(0, 1), default=1,
                   help="SIDECAR_SYNC_TREAT_CPU_AS_DEVICE for the engine (1: scans watch CPU tensors, the path a GPU host takes)")
    p.add_argument("--traffic-only", action="store_true",
                   help="no captures, scans or restarts: the baseline growth of vLLM with the plugin idle")
    p.add_argument("--work-dir", type=Path, default=None, help="logs and the trace dir (default: a new temporary folder)")
    p.add_argument("--out", type=Path, default=None, help="default bench-results/soak-<timestamp>.json")
    p.add_argument("--verbose", action="store_true", help="print every sample")
    args = p.parse_args(argv)

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench-results" / f"soak-{stamp}.json"
    if not (args.model / "config.json").exists():
        print(f"soak: building the tiny model in {args.model}", flush=True)
        build_model(args.model, size="tiny")
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="sidecar-soak-"))
    env = {"SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": str(args.scan_cpu_as_device)}
    stack = VllmStack(model_dir=args.model, work_dir=work, env=env, sidecar_args=("--keep", str(args.keep)))
    jobs = ("no captures, scans or restarts" if args.traffic_only else
            f"a {args.capture_steps}-step capture every {args.capture_every_min:g} min and a {args.scan_steps}-step "
            f"scan 30 s after it, a sidecar restart ({args.restart_kind}) every {args.restart_every_min:g} min")
    print(f"soak: {args.minutes:g} min, {args.clients} streaming clients x {args.max_tokens} tokens, {jobs}; "
          f"sampling every {args.sample_every_s:g} s; logs and traces in {work}", flush=True)
    soak = Soak(stack, args)
    try:
        began = time.monotonic()
        stack.start(server_timeout=600)
        print(f"soak: vLLM and the sidecar up in {time.monotonic() - began:.0f} s; running", flush=True)
        soak.run()
    finally:
        soak.traffic.stop.set()
        stack.close()

    keys = soak.proc_keys()
    every = (args.table_every_min or (5 if args.minutes >= 15 else 1)) * 60
    lines, failures, warnings, fig = verdict(soak, args)
    print()
    print(f"soak over time (RSS MiB/open fds per process; requests, captures and scans so far; ITL and max gap of "
          f"the requests finished in the {args.sample_every_s:g} s before the sample):")
    for ln in table(soak.samples, keys, every):
        print("  " + ln)
    print()
    print("verdict:")
    for ln in lines:
        print("  " + ln)
    for w in warnings:
        print(f"  warning: {w}")
    print(f"  {'FAIL: ' + '; '.join(failures) if failures else 'PASS'}")

    report = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "started_at": soak.samples[0]["at"] if soak.samples else None, "work_dir": str(work),
        "samples": soak.samples, "captures": soak.captures, "scans": soak.scans, "restarts": soak.restarts,
        "engine_pid_changes": soak.pid_changes, "requests": soak.final_traffic, "request_errors": soak.traffic.errors,
        "verdict": {"pass": not failures, "failures": failures, "warnings": warnings, "lines": lines, **fig},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"  time series: {out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
