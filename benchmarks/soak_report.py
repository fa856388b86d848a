"""The soak's report (benchmarks/soak.py): the table over time and the verdict, read from a finished
run's samples, jobs, restarts and logs. Judging a run is kept apart from running it."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.common.verdicts import DONE, FINAL

if TYPE_CHECKING:
    import argparse

    from soak import Soak

MiB = 1024 * 1024
ROLE_SHORT = {"sidecar": "sidecar", "api_server": "api", "engine_core": "core", "worker": "worker", "driver": "driver"}



def dir_usage(root: Path) -> tuple[int, int, int]:
    """(bytes of every file under root, capture folders, saved scans); files may vanish as we walk."""
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    def count(sub: str) -> int:
        try:
            return sum(1 for _ in (root / sub).iterdir())
        except FileNotFoundError:
            return 0
    return total, count("captures"), count("scans")


def fmt_proc(p: dict | None) -> str:
    return "-" if not p else f"{p['rss'] / MiB:.0f}/{p['fds']}"


def row_cells(s: dict, keys: list[str]) -> str:
    cells = [f"{ROLE_SHORT.get(k.split(':')[0], k)}={fmt_proc(s['processes'].get(k))}" for k in keys]
    c, sc = s["captures"], s["scans"]
    return (" ".join(cells) + f"  disk={s['disk_bytes'] / MiB:.1f}MiB dirs={s['capture_folders']}"
            f" req={s['requests_done']}/{s['requests_failed']} cap={c.get(DONE, 0)}/{sum(c.values()) - c.get(DONE, 0)}"
            f" scan={sc.get(DONE, 0)}/{sum(sc.values()) - sc.get(DONE, 0)}")


def table(samples: list[dict], keys: list[str], every_s: float) -> list[str]:
    picked, next_t = [], 0.0
    for i, s in enumerate(samples):
        # A row per interval: its first sample with the sidecar up (one taken during a restart has none).
        if i == 0 or i == len(samples) - 1 or (s["t"] >= next_t and s["processes"].get("sidecar")):
            picked.append(s)
            while next_t <= s["t"]:
                next_t += every_s
    heads = ["t (min)", *[ROLE_SHORT.get(k.split(":")[0], k) + (k[len("worker"):] if k.startswith("worker:") and k != "worker:0" else "") for k in keys],
             "disk MiB", "dirs", "req ok", "req fail", "cap ok", "cap other", "scan ok", "scan other", "ITL ms", "max gap ms"]
    rows = []
    for s in picked:
        c, sc = s["captures"], s["scans"]
        rows.append([f"{s['t'] / 60:.1f}", *[fmt_proc(s["processes"].get(k)) for k in keys],
                     f"{s['disk_bytes'] / MiB:.1f}", str(s["capture_folders"]), str(s["requests_done"]),
                     str(s["requests_failed"]), str(c.get(DONE, 0)), str(sum(c.values()) - c.get(DONE, 0)),
                     str(sc.get(DONE, 0)), str(sum(sc.values()) - sc.get(DONE, 0)),
                     "-" if s["window_mean_itl_ms"] is None else f"{s['window_mean_itl_ms']:.1f}",
                     f"{s['window_max_gap_ms']:.0f}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    return [line(heads), *map(line, rows)]


def runs(soak: "Soak", key: str, warmup_s: float) -> list[tuple[int, list[tuple[float, dict]]]]:
    """[(pid, [(t, stats), ...])] of ``key``, one run per pid, each from the end of its warm-up on.

    An engine process (one pid for the whole soak, or it restarted) warms up for ``warmup_s`` of
    traffic. The sidecar starts afresh at every restart; each incarnation is judged on its own, from
    the first sample after the first capture or scan it finished (the first one loads the export,
    merge and analysis code, a one-off step up in RSS)."""
    by_pid: dict[int, list[tuple[float, dict]]] = {}
    for s in soak.samples:
        p = s["processes"].get(key)
        if p:
            by_pid.setdefault(p["pid"], []).append((s["t"], p))
    out = []
    for pid, pts in by_pid.items():
        if key == "sidecar":
            ends = [j["t"] + j["seconds"] for j in soak.captures + soak.scans if j.get("sidecar_pid") == pid and "seconds" in j]
            since = min(ends) if ends else pts[0][0]
        else:
            since = warmup_s
        out.append((pid, [(t, p) for t, p in pts if t >= since]))
    return out


def rose_only(fds: list[int]) -> bool:
    return len(fds) > 2 and fds[-1] > fds[0] and all(b >= a for a, b in zip(fds, fds[1:]))


def fd_leaks(soak: "Soak", keys: list[str], warmup_s: float, threshold: int) -> list[str]:
    """Processes whose fd count never fell after warm-up and rose by more than ``threshold``.

    Why this rule: a process's fd count wanders legitimately (streaming clients' sockets, the probe
    channel reconnecting, trace files open while a capture exports, the export pool's threads), so a
    count that goes down at any point is not read as a leak. A leak of one fd per request, capture,
    scan or reconnect shows as a count that only ever rises; the threshold leaves room for the few
    fds a process opens lazily once and keeps (a log file, a thread pool's pipe, a cached library),
    which make a short series rise "monotonically" without leaking. Each sidecar incarnation is
    judged on its own samples (its pid), since a restart starts its count afresh."""
    leaks = []
    for key in keys:
        for pid, pts in runs(soak, key, warmup_s):
            fds = [p["fds"] for _, p in pts]
            if rose_only(fds) and fds[-1] - fds[0] > threshold:
                leaks.append(f"{key} (pid {pid}): fds {fds[0]} -> {fds[-1]}, never fell, over {len(fds)} samples")
    return leaks


def log_problems(path: Path, upto: int | None) -> dict:
    """Tracebacks and ERROR lines in the first ``upto`` bytes of a log, with the first few ERROR lines."""
    try:
        with open(path, "rb") as f:
            text = f.read(upto if upto is not None else -1).decode(errors="replace")
    except FileNotFoundError:
        return {"tracebacks": 0, "errors": 0, "first_errors": []}
    errors = [ln.strip()[:240] for ln in text.splitlines() if re.search(r"\bERROR\b|\bCRITICAL\b", ln)]
    return {"tracebacks": text.count("Traceback (most recent call last)"), "errors": len(errors), "first_errors": errors[:5]}


def verdict(soak: Soak, args: argparse.Namespace) -> tuple[list[str], list[str], list[str], dict]:
    """(report lines, failure reasons, warnings, figures for the JSON). Warnings do not fail the run:
    they are what a reader should look at (a traceback in a log, memory that grew, an unclean exit)."""
    lines, failures, warnings, fig = [], [], [], {}
    keys = soak.proc_keys()
    t = soak.final_traffic
    lines.append(f"requests: {t['requests_done']} done, {t['requests_failed']} failed, {t['tokens']} tokens "
                 f"({t['tokens'] / (args.minutes * 60):.1f} tok/s over the run)")
    if t["requests_failed"]:
        failures.append(f"{t['requests_failed']} requests failed")
        for e in soak.traffic.errors[:5]:
            lines.append(f"  failed at t={e['at'] - soak.samples[0]['at'] + soak.samples[0]['t']:.0f}s: {e['error']}")

    for name, jobs in (("captures", soak.captures), ("scans", soak.scans)):
        outcomes = Counter(j["outcome"] for j in jobs)
        lines.append(f"{name}: {len(jobs)} started" + "".join(f", {n} {k}" for k, n in sorted(outcomes.items())))
        for j in jobs:
            if j["outcome"] != DONE:
                lines.append(f"  t={j['t']:.0f}s {j['id']}: {j['outcome']}: {j['reason']}"
                             + (f"; {'; '.join(j.get('processes', []))}" if j.get("processes") else ""))
        stuck = [j for j in jobs if j["outcome"] not in FINAL]
        if stuck:
            failures.append(f"{len(stuck)} {name} did not reach a final state (" + ", ".join(sorted({j['outcome'] for j in stuck})) + ")")
        secs = [j["seconds"] for j in jobs if "seconds" in j]
        if secs:
            lines.append(f"  start to verdict: {min(secs):.1f}-{max(secs):.1f} s")

    for r in soak.restarts:
        lines.append(f"restart at t={r['t']:.0f}s ({r['signal']}): exit {r['exit_code']} in {r['stop_s']} s, "
                     f"pid {r['old_pid']} -> {r.get('new_pid')}, serving after {r.get('up_s')} s, every engine process "
                     f"back after {r['back_s']} s"
                     + ("" if r["ok"] else f": FAILED {r.get('error')}"))
        if not r["ok"]:
            failures.append(f"the sidecar restart at t={r['t']:.0f}s failed: {r.get('error')}")
        if r["signal"] == "SIGTERM" and r["exit_code"] != 0:
            # -9: it did not exit within 20 s of SIGTERM and the stack killed it.
            warnings.append(f"SIGTERM at t={r['t']:.0f}s ended the sidecar with exit code {r['exit_code']}, not 0")
    for c in soak.pid_changes:
        lines.append(f"engine process {c['process']} changed pid {c['old']} -> {c['new']} at t={c['t']}s: it restarted")
        failures.append(f"engine process {c['process']} restarted")

    lines.append(f"memory and fds from the first sample after the {args.warmup_s:.0f} s warm-up to the last "
                 f"(the sidecar: each incarnation from its first finished capture or scan):")
    fig["growth"] = []
    for key in keys:
        for pid, pts in runs(soak, key, args.warmup_s):
            if len(pts) < 2:
                lines.append(f"  {key:<12} pid {pid:>7}  too few samples after its warm-up ({len(pts)})")
                continue
            (t0, a), (t1, b) = pts[0], pts[-1]
            d_rss = (b["rss"] - a["rss"]) / MiB
            peak = max(p["rss"] for _, p in pts) / MiB
            fds = [p["fds"] for _, p in pts]
            fig["growth"].append({"process": key, "pid": pid, "from_t": t0, "to_t": t1, "rss_from": a["rss"],
                                  "rss_to": b["rss"], "rss_peak": int(peak * MiB), "fds_from": a["fds"],
                                  "fds_to": b["fds"], "fds_min": min(fds), "fds_max": max(fds),
                                  "fds_rose_only": rose_only(fds)})
            # A rate only over a span long enough to mean something (a short one extrapolates noise).
            rate = f", {d_rss / ((t1 - t0) / 3600):+.0f} MiB/h" if t1 - t0 >= 600 else ""
            if d_rss > args.rss_warn_mib:
                warnings.append(f"{key} (pid {pid}) RSS grew {d_rss:+.1f} MiB after its warm-up")
            lines.append(f"  {key:<12} pid {pid:>7}  t={t0 / 60:4.1f}-{t1 / 60:4.1f} min  RSS {a['rss'] / MiB:7.1f} -> "
                         f"{b['rss'] / MiB:7.1f} MiB ({d_rss:+.1f} MiB{rate}; peak {peak:.1f})  fds {a['fds']} -> "
                         f"{b['fds']} ({b['fds'] - a['fds']:+d}; min {min(fds)}, max {max(fds)}"
                         + (", never fell" if rose_only(fds) else "") + ")")
    leaks = fd_leaks(soak, keys, args.warmup_s, args.fd_threshold)
    for leak in leaks:
        failures.append(f"fd count grew monotonically by more than {args.fd_threshold}: {leak}")

    last = soak.samples[-1]
    bound = args.keep * soak.largest_capture_bytes
    scans_bytes = dir_usage(soak.stack.trace_dir / "scans")[0]
    fig["disk"] = {"bytes_end": last["disk_bytes"], "capture_folders_end": last["capture_folders"],
                   "scans_saved_end": last["scans_saved"], "largest_capture_bytes": soak.largest_capture_bytes,
                   "keep": args.keep, "bound_bytes": bound + scans_bytes}
    lines.append(f"disk: {last['disk_bytes'] / MiB:.2f} MiB under the trace dir at the end, {last['capture_folders']} "
                 f"capture folders and {last['scans_saved']} saved scans (--keep {args.keep}); bound: keep x the "
                 f"largest capture ({soak.largest_capture_bytes / MiB:.2f} MiB) + saved scans ({scans_bytes / MiB:.2f} MiB) "
                 f"= {(bound + scans_bytes) / MiB:.2f} MiB")
    if last["capture_folders"] > args.keep:
        failures.append(f"{last['capture_folders']} capture folders kept, more than --keep {args.keep}")
    if last["disk_bytes"] > bound + scans_bytes + MiB:  # + 1 MiB: the sidecar's own small files
        warnings.append("more bytes under the trace dir than the bound: something besides the kept captures stays")

    for name in ("sidecar.log", soak.stack.log_name):
        p = log_problems(soak.stack.work_dir / name, soak.log_bytes.get(name))
        fig[name] = p
        lines.append(f"{name}: {p['tracebacks']} tracebacks, {p['errors']} ERROR lines")
        if p["tracebacks"] or p["errors"]:
            warnings.append(f"{name} has {p['tracebacks']} tracebacks and {p['errors']} ERROR lines ({soak.stack.work_dir / name})")
        for e in p["first_errors"]:
            lines.append(f"  {e}")
    return lines, failures, warnings, fig
