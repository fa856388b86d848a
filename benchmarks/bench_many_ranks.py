"""Benchmark: one capture across many ranks (issue 14, "Many ranks"): time to a merged trace and
summary, and the sidecar's peak memory, for 8, 16, 32 and 64 ranks.

A real sidecar (``sidecar serve``, a subprocess of its own for each rank count, so that its peak
memory is its own) and N simulated GPU worker ranks that speak the real probe channel
(sidecar/protocol.py) from one asyncio loop in this process: the handshake (``hello`` with the
probe's trace root and marker, so the sidecar reads the files where they lie, ``challenge``,
``proof``), heartbeats with a working-step count that advances at ``--step-rate`` in every rank
alike (as the ranks of one engine count the same steps), ``clock_reply``, and the capture's reports
(``armed`` with the step count, ``capturing`` at the start step, ``exporting``, ``done`` with the
raw trace). Each rank's raw trace is a real Kineto GPU trace (``--trace``: by default the shared
``a100-nccl-multistream``, 9.8 MB of JSON, about 41k events, NCCL kernels on several streams)
rewritten for that rank: its own host pid, ``distributedInfo`` rank and world size, and a base time
a quarter of a millisecond after the previous rank's. The files are written before the capture
starts and moved into ``<root>/captures/<id>/raw/`` when a rank reports ``done``, as a probe's
export leaves them: the figures are the sidecar's, not the disk's.

Measured per rank count: the time from ``POST /profile/start`` to the verdict (the capture ``done``,
its merged trace and summary written), and from the last rank's ``done`` to the verdict (the
sidecar's own part: compressing, merging and analysing); the sidecar's resident memory when idle
with every probe connected, its peak (``VmHWM`` of /proc/<pid>/status, read at the end) and its
CPU time. The capture is checked: state ``done``, every rank in the merged trace's header and in the
summary's processes. ``--breakdown`` also runs ``merge.finalize_capture`` in a process of its own
on the largest count's files and reports the peak of each of its steps (checking the raw traces,
compressing them, merging, analysing the merged trace), each peak reset before its step
(``/proc/self/clear_refs``). Results: a table on stdout and ``bench-results/many_ranks.json``.

    python benchmarks/bench_many_ranks.py [--ranks 8,16,32,64] [--trace PATH] [--steps 3] [--breakdown]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import aiohttp

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from sidecar import auth  # noqa: E402
from sidecar.probe.trace_root import TraceRoot  # noqa: E402
from sidecar.protocol import (PROBE_WS_PATH, PROTOCOL_VERSION, Arm, Begin, CaptureReport, Challenge,  # noqa: E402
                              ClockProbe, ClockReply, Heartbeat, Hello, ProcessIdentity, Proof, Stop, Verdict,
                              decode_from_sidecar, encode)

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "a100-nccl-multistream.json.gz"
DEFAULT_RANKS = (8, 16, 32, 64)
PID_BASE = 3_000_000  # the simulated ranks' pids: PID_BASE + rank (under Linux's largest, 2**22)
BASE_STEP_NS = 250_000  # each rank's profiler started this long after the previous one's
HEARTBEAT_S = 2.0  # as a real probe's
_PID_MARK = b"\x00PID\x00"


# -- the ranks' raw traces --------------------------------------------------------------------------------
@dataclass
class TraceTemplate:
    """A Kineto trace with its host pid, rank, world size and base time made replaceable."""

    text: bytes
    host_pid: int
    base_ns: int | None
    events: int

    @classmethod
    def load(cls, path: Path) -> "TraceTemplate":
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
        events = data["traceEvents"]
        counts: dict[Any, int] = {}
        for ev in events:  # the host process: the pid of the most CPU-side events
            if isinstance(ev.get("pid"), int) and ev.get("cat") in ("cpu_op", "cuda_runtime", "user_annotation"):
                counts[ev["pid"]] = counts.get(ev["pid"], 0) + 1
        host_pid = max(counts, key=counts.get)
        text = re.sub(rb'"pid":(\s*)' + str(host_pid).encode() + rb"\b", rb'"pid":\1' + _PID_MARK, raw)
        base = data.get("baseTimeNanoseconds")
        return cls(text, host_pid, int(base) if base else None, len(events))

    def for_rank(self, rank: int, world: int, pid: int) -> bytes:
        text = self.text.replace(_PID_MARK, str(pid).encode())
        head_end = text.find(b'"traceEvents"')
        head, rest = text[:head_end], text[head_end:]
        head = re.sub(rb'("rank":\s*)\d+', rb"\g<1>" + str(rank).encode(), head, count=1)
        head = re.sub(rb'("world_size":\s*)\d+', rb"\g<1>" + str(world).encode(), head, count=1)
        text = head + rest
        if self.base_ns is not None:
            base = self.base_ns + rank * BASE_STEP_NS
            text = re.sub(rb'("baseTimeNanoseconds":\s*)\d+', rb"\g<1>" + str(base).encode(), text, count=1)
        return text


def identity(rank: int, pid: int) -> ProcessIdentity:
    return ProcessIdentity(role="worker", role_label="worker", step_driven=True, pid=pid, rank=rank,
                           host=socket.gethostname(), cuda=True, engine="simulated ranks")


# -- a simulated rank: the probe channel, spoken as a probe does ---------------------------------------------
@dataclass
class Clock:
    """The engine's working steps, the same in every rank: ``rate`` a second since ``t0``."""

    rate: float
    t0: float = field(default_factory=time.monotonic)

    def steps(self) -> int:
        return int((time.monotonic() - self.t0) * self.rate)

    async def reach(self, step: int) -> None:
        while self.steps() < step:
            await asyncio.sleep(max((step - self.steps()) / self.rate, 0.005))


class SimulatedRank:
    """One worker rank on the probe channel. Its raw trace lies in ``staged`` until it reports
    ``done``: then it is moved where the probe's export writes it."""

    def __init__(self, root: Path, rank: int, staged: Path, token: str, clock: Clock) -> None:
        self.root, self.rank, self.staged, self.token, self.clock = TraceRoot(root), rank, staged, token, clock
        self.identity = identity(rank, PID_BASE + rank)
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.done_at: float | None = None  # time.monotonic() when it reported done
        self.verdict: Verdict | None = None
        self.verdict_event = asyncio.Event()
        self.spec: Any = None  # the capture it was armed for
        self._tasks: list[asyncio.Task] = []
        self._send_lock = asyncio.Lock()

    async def connect(self, session: aiohttp.ClientSession, base_url: str) -> None:
        ws = await session.ws_connect(base_url + PROBE_WS_PATH, max_msg_size=1 << 20)
        nonce = auth.new_nonce()
        marker = self.root.make_marker()
        await ws.send_str(encode(Hello(protocol=PROTOCOL_VERSION, process=self.identity, nonce=nonce,
                                       files_at=str(self.root.path), marker=marker)))
        challenge = decode_from_sidecar((await ws.receive(timeout=30)).data)
        if not isinstance(challenge, Challenge) or not auth.sidecar_proof_ok(
                self.token, nonce, challenge.nonce, challenge.proof):
            raise RuntimeError(f"rank {self.rank}: the sidecar's proof does not check out")
        await ws.send_str(encode(Proof(proof=auth.probe_proof(self.token, challenge.nonce, nonce))))
        self.ws = ws
        self._tasks = [asyncio.ensure_future(self._read()), asyncio.ensure_future(self._heartbeats())]

    async def send(self, msg: Any) -> None:
        async with self._send_lock:
            await self.ws.send_str(encode(msg))

    async def _heartbeats(self) -> None:
        while True:
            await self.send(Heartbeat(steps=self.clock.steps()))
            await asyncio.sleep(HEARTBEAT_S)

    async def _read(self) -> None:
        async for frame in self.ws:
            if frame.type != aiohttp.WSMsgType.TEXT:
                break
            msg = decode_from_sidecar(frame.data)
            if isinstance(msg, ClockProbe):
                await self.send(ClockReply(seq=msg.seq, probe_ns=time.time_ns()))
            elif isinstance(msg, Arm):
                self.spec = msg.spec
                await self.send(CaptureReport(job_id=msg.spec.id, state="armed", steps_seen=self.clock.steps()))
            elif isinstance(msg, Begin):
                self._tasks.append(asyncio.ensure_future(self._record(msg)))
            elif isinstance(msg, Stop):
                pass  # the steps end it here; a stop comes only from a timeout or a user
            elif isinstance(msg, Verdict):
                self.verdict = msg
                self.verdict_event.set()

    async def _record(self, begin: Begin) -> None:
        job, steps = begin.job_id, self.spec.steps
        await self.clock.reach(begin.start_step)
        first = max(begin.start_step, self.clock.steps())
        await self.send(CaptureReport(job_id=job, state="capturing", first_step=first))
        await self.clock.reach(first + steps)
        await self.send(CaptureReport(job_id=job, state="exporting", steps_recorded=steps, first_step=first))
        started = time.perf_counter()
        target = Path(self.root.capture_file(job, self.identity.file_stem))
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(self.staged, target)  # what the profiler's export leaves there
        export_ms = (time.perf_counter() - started) * 1000
        await self.send(CaptureReport(job_id=job, state="done", steps_recorded=steps, first_step=first,
                                      file=str(target), bytes=target.stat().st_size, export_ms=export_ms))
        self.done_at = time.monotonic()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.ws is not None:
            await self.ws.close()


def stage_traces(template: TraceTemplate, ranks: int, folder: Path) -> list[Path]:
    """Write each rank's raw trace into ``folder``; their paths, by rank."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank in range(ranks):
        path = folder / f"rank{rank}.json"
        path.write_bytes(template.for_rank(rank, ranks, PID_BASE + rank))
        paths.append(path)
    return paths


async def wait_for_processes(session: aiohttp.ClientSession, base_url: str, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        async with session.get(base_url + "/processes") as resp:
            if len((await resp.json())["processes"]) >= count:
                return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"fewer than {count} probes connected within {timeout_s:g} s")


@dataclass
class CaptureRun:
    capture: dict  # GET /profile/{id} at the end
    summary: dict | None
    merged_processes: list[dict]  # the merged trace's header: inference_sidecar.processes
    start_to_verdict_s: float
    last_done_to_verdict_s: float
    start_to_last_done_s: float


async def run_capture(base_url: str, root: Path, staged: list[Path], token: str, *, steps: int = 3,
                      step_rate: float = 20.0, timeout_s: float = 600.0,
                      on_connected: Any = None) -> CaptureRun:
    """Connect one simulated rank per staged trace, run one capture of ``steps`` steps across all of
    them, and return what the sidecar made of it. ``on_connected()``: called once every rank is
    connected, before the capture starts (the benchmark reads the idle memory there)."""
    clock = Clock(step_rate)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        ranks = [SimulatedRank(root, k, path, token, clock) for k, path in enumerate(staged)]
        try:
            await asyncio.gather(*(r.connect(session, base_url) for r in ranks))
            await wait_for_processes(session, base_url, len(ranks))
            await asyncio.sleep(HEARTBEAT_S + 0.5)  # a second heartbeat: a measured step rate, as in a real engine
            if on_connected is not None:
                on_connected()
            started = time.monotonic()
            async with session.post(base_url + "/profile/start", json={"steps": steps, "timeout_s": timeout_s}) as resp:
                body = await resp.json()
                if resp.status != 202:
                    raise RuntimeError(f"/profile/start: {resp.status} {body}")
            capture_id = body["id"]
            await asyncio.wait_for(asyncio.gather(*(r.verdict_event.wait() for r in ranks)), timeout_s)
            ended = time.monotonic()
            async with session.get(f"{base_url}/profile/{capture_id}") as resp:
                capture = await resp.json()
            summary = None
            if capture.get("summary"):
                async with session.get(base_url + capture["summary"]) as resp:
                    summary = await resp.json()
            merged: list[dict] = []
            if capture.get("trace"):
                async with session.get(base_url + capture["trace"]) as resp:
                    merged = merged_header(await resp.read())["inference_sidecar"]["processes"]
            done = [r.done_at for r in ranks if r.done_at is not None]
            last_done = max(done) if done else ended
            return CaptureRun(capture, summary, merged, ended - started, ended - last_done, last_done - started)
        finally:
            await asyncio.gather(*(r.close() for r in ranks), return_exceptions=True)


def merged_header(gz: bytes) -> dict:
    """The merged trace's header (every member before ``traceEvents``), read from its first bytes."""
    text = zlib.decompressobj(wbits=31).decompress(gz, 1 << 20)
    head = text[: text.index(b', "traceEvents": [')] + b"}"
    return json.loads(head)


def merged_process_names(gz_path: Path) -> dict[Any, str]:
    """Every ``process_name`` of a merged trace, by pid (streamed: the file may be large)."""
    from sidecar.analysis.stream import TopLevel, read_events

    names = {}
    for batch in read_events(str(gz_path), TopLevel(), Any, keep=frozenset()):
        for ev in batch:
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                names[ev["pid"]] = ev["args"]["name"]
    return names


# -- the sidecar, a process of its own -------------------------------------------------------------------
class Sidecar:
    """``sidecar serve`` on a free port, its memory read from /proc/<pid>/status."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.token_file = work / "token"
        env = {**os.environ, "SIDECAR_TOKEN_FILE": str(self.token_file)}
        env.pop("SIDECAR_TOKEN", None)
        exe = Path(sys.executable).with_name("sidecar")
        cmd = [str(exe)] if exe.exists() else [
            sys.executable, "-c", "import sys; from sidecar.cli import main; sys.exit(main())"]
        self.proc = subprocess.Popen(
            [*cmd, "serve", "--port", "0", "--trace-dir", str(work / "sidecar-traces"), "--log-level", "WARNING",
             "--max-capture-mb", str(1 << 20), "--keep-mb", str(1 << 20), "--min-free-mb", "0"],
            stderr=subprocess.PIPE, text=True, env=env, cwd=work)
        self.url = self._wait_listening()
        self.token = self.token_file.read_text().strip()
        self.log: list[str] = []
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_listening(self, timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        lines = []
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                return m.group(1)
        self.close()
        raise RuntimeError("the sidecar did not start:\n" + "".join(lines))

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)

    def status_kib(self, field_name: str) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return int(re.search(rf"{field_name}:\s+(\d+)", fh.read()).group(1))

    def cpu_s(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class RssSampler:
    """The highest resident memory of a process seen while it runs, and when (every ``every_s``)."""

    def __init__(self, sidecar: Sidecar, every_s: float = 0.05) -> None:
        self.sidecar, self.every_s = sidecar, every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "RssSampler":
        self.t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((round(time.monotonic() - self.t0, 3), self.sidecar.status_kib("VmRSS")))
            except (OSError, AttributeError):
                return
            self._stop.wait(self.every_s)


# -- one rank count ---------------------------------------------------------------------------------------
def measure(ranks: int, template: TraceTemplate, work: Path, steps: int, step_rate: float) -> dict:
    work.mkdir(parents=True)
    root = work / "probe-root"
    staged = stage_traces(template, ranks, work / "staged")
    raw_bytes = sum(p.stat().st_size for p in staged)
    sidecar = Sidecar(work)
    idle: dict[str, float] = {}
    try:
        def connected() -> None:
            idle["rss_kib"] = sidecar.status_kib("VmRSS")
            idle["hwm_kib"] = sidecar.status_kib("VmHWM")
            idle["cpu_s"] = sidecar.cpu_s()

        with RssSampler(sidecar) as sampler:
            run = asyncio.run(run_capture(sidecar.url, root, staged, sidecar.token, steps=steps,
                                          step_rate=step_rate, on_connected=connected))
        peak_kib = sidecar.status_kib("VmHWM")
        cpu_s = sidecar.cpu_s() - idle["cpu_s"]
    finally:
        sidecar.close()
    capture = run.capture
    ranks_in_trace = sorted(p["rank"] for p in run.merged_processes if p["rank"] is not None)
    summary_ranks = sorted(p["rank"] for p in (run.summary or {}).get("processes", []) if p["rank"] is not None)
    problems = []
    if capture["state"] != "done":
        problems.append(f"capture {capture['state']}: {capture['reason']}")
    if ranks_in_trace != list(range(ranks)):
        problems.append(f"the merged trace holds ranks {ranks_in_trace}")
    if sorted(set(summary_ranks)) != list(range(ranks)):
        problems.append(f"the summary holds ranks {sorted(set(summary_ranks))}")
    files_bytes = sum(p["bytes"] or 0 for p in capture["processes"])
    return {
        "ranks": ranks,
        "raw_mb": round(raw_bytes / 1e6, 1),
        "merged_mb": round((capture["trace_bytes"] or 0) / 1e6, 1),
        "per_rank_gz_mb": round(files_bytes / 1e6, 1),
        "state": capture["state"],
        "headline": capture["headline"],
        "start_to_verdict_s": round(run.start_to_verdict_s, 2),
        "start_to_last_done_s": round(run.start_to_last_done_s, 2),
        "last_done_to_verdict_s": round(run.last_done_to_verdict_s, 2),
        "per_rank_s": round(run.last_done_to_verdict_s / ranks, 3),
        "rss_idle_mib": round(idle["rss_kib"] / 1024, 1),
        "peak_mib": round(peak_kib / 1024, 1),
        "peak_before_capture_mib": round(idle["hwm_kib"] / 1024, 1),
        "increase_mib": round((peak_kib - idle["rss_kib"]) / 1024, 1),
        "sampled_peak_mib": round(max((kib for _t, kib in sampler.samples), default=0) / 1024, 1),
        "sidecar_cpu_s": round(cpu_s, 1),
        "rss_timeline_mib": _thin([(t, round(kib / 1024, 1)) for t, kib in sampler.samples], 400),
        "problems": problems,
    }


def _thin(samples: list, most: int) -> list:
    step = max(1, len(samples) // most)
    return samples[::step]


# -- where the memory goes, step by step (--breakdown) ---------------------------------------------------
# In a process of its own: finalize_capture on staged raw traces, each of its steps wrapped to report
# the process's peak over that step (the peak is reset before each: /proc/self/clear_refs, "5").
_BREAKDOWN = r"""
import json, re, sys, time
from pathlib import Path
from types import SimpleNamespace
sys.path.insert(0, sys.argv[1])
from sidecar.protocol import ProcessIdentity
from sidecar.service import merge

def kib(field):
    with open('/proc/self/status') as fh:
        return int(re.search(field + r':\s+(\d+)', fh.read()).group(1))

def reset():
    try:
        with open('/proc/self/clear_refs', 'w') as fh:
            fh.write('5')
    except OSError:
        pass

steps = {}
def wrap(name, fn):
    def wrapped(*a, **k):
        reset()
        start, before = time.perf_counter(), kib('VmRSS')
        try:
            return fn(*a, **k)
        finally:
            row = steps.setdefault(name, {"calls": 0, "seconds": 0.0, "peak_kib": 0, "rss_before_kib": before})
            row["calls"] += 1
            row["seconds"] += time.perf_counter() - start
            row["peak_kib"] = max(row["peak_kib"], kib('VmHWM'))
    return wrapped

merge.check_trace = wrap("check (first pass over each raw trace)", merge.check_trace)
merge.compress_with_stacks = wrap("compress (each raw trace)", merge.compress_with_stacks)
merge.write_merged = wrap("merge (second pass, all ranks)", merge.write_merged)
merge._analyse = wrap("analyse the merged trace", merge._analyse)
capture = Path(sys.argv[2])
records = []
for spec in json.loads(sys.argv[3]):
    ident = ProcessIdentity(role="worker", role_label="worker", step_driven=True, pid=spec["pid"], rank=spec["rank"])
    records.append(SimpleNamespace(label=ident.label, role="worker", pid=ident.pid, rank=ident.rank, step_driven=True,
                                   sort_key=ident.sort_key, stem=ident.file_stem, state="done",
                                   raw_file=spec["raw_file"], stacks="none", stack_summary=None, stacks_file=None,
                                   clock_correction_ns=0))
reset()
start = time.perf_counter()
result = merge.finalize_capture(capture, records, 1 << 50)
total = time.perf_counter() - start
print(json.dumps({"steps": steps, "seconds": total, "peak_kib_last_step": kib('VmHWM'),
                  "trace_bytes": result.trace_bytes, "problems": result.problems}))
"""


def breakdown(ranks: int, template: TraceTemplate, work: Path) -> dict:
    capture = work / "capture"
    raw = capture / "raw"
    paths = stage_traces(template, ranks, raw)
    specs = []
    for rank, path in enumerate(paths):
        stem = identity(rank, PID_BASE + rank).file_stem
        target = raw / f"{stem}.json"
        path.rename(target)
        specs.append({"rank": rank, "pid": PID_BASE + rank, "raw_file": str(target)})
    proc = subprocess.run([sys.executable, "-c", _BREAKDOWN, str(REPO), str(capture), json.dumps(specs)],
                          capture_output=True, text=True, cwd=REPO, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"breakdown failed:\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(capture, ignore_errors=True)
    return {"ranks": ranks, "seconds": round(out["seconds"], 2), "steps": {
        name: {"seconds": round(row["seconds"], 2), "calls": row["calls"],
               "rss_before_mib": round(row["rss_before_kib"] / 1024, 1), "peak_mib": round(row["peak_kib"] / 1024, 1)}
        for name, row in out["steps"].items()}}


# -- the report -------------------------------------------------------------------------------------------
def growth(rows: list[dict]) -> dict:
    first, last = rows[0], rows[-1]
    ratio = last["ranks"] / first["ranks"]

    def times(key: str) -> float | None:
        return round(last[key] / first[key], 2) if first[key] else None

    return {"ranks": f"{first['ranks']} -> {last['ranks']} (x{ratio:g})",
            "last_done_to_verdict": times("last_done_to_verdict_s"),
            "start_to_verdict": times("start_to_verdict_s"),
            "per_rank_s": times("per_rank_s"),
            "peak_mib": times("peak_mib"),
            "increase_mib": times("increase_mib")}


def print_table(trace: str, template: TraceTemplate, rows: list[dict]) -> None:
    print(f"{trace}: {len(template.text) / 1e6:.1f} MB of JSON, {template.events:,} events per rank")
    print(f"{'ranks':>5} {'raw MB':>7} {'merged MB':>9} {'start->done':>11} {'last rank->done':>15} {'per rank':>8} "
          f"{'idle RSS':>9} {'peak RSS':>9} {'increase':>9} {'CPU s':>6}  state")
    for r in rows:
        print(f"{r['ranks']:>5} {r['raw_mb']:>7.0f} {r['merged_mb']:>9.1f} {r['start_to_verdict_s']:>10.1f}s "
              f"{r['last_done_to_verdict_s']:>14.1f}s {r['per_rank_s']:>7.2f}s {r['rss_idle_mib']:>5.0f} MiB "
              f"{r['peak_mib']:>5.0f} MiB {r['increase_mib']:>5.0f} MiB {r['sidecar_cpu_s']:>6.1f}  {r['state']}"
              + (f"  PROBLEMS: {'; '.join(r['problems'])}" if r["problems"] else ""))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=",".join(map(str, DEFAULT_RANKS)),
                        help="rank counts to measure, comma-separated (default %(default)s)")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="a Kineto GPU trace (.json or .json.gz)")
    parser.add_argument("--steps", type=int, default=3, help="steps in each capture (default %(default)s)")
    parser.add_argument("--step-rate", type=float, default=20.0, help="the simulated engine's steps/s (default %(default)s)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also measure each step of finalize_capture on the largest count, in a process of its own")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "many_ranks.json")
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.ranks.split(",") if n.strip()]
    if not args.trace.is_file():
        print(f"bench_many_ranks: {args.trace} not found (the shared traces beside the repository); skipped",
              file=sys.stderr)
        return 0
    template = TraceTemplate.load(args.trace)
    rows = []
    parts = None
    with tempfile.TemporaryDirectory(prefix="bench-many-ranks-") as tmp:
        for n in counts:
            rows.append(measure(n, template, Path(tmp) / f"ranks-{n}", args.steps, args.step_rate))
            print(f"  {n} ranks: {rows[-1]['last_done_to_verdict_s']} s, peak {rows[-1]['peak_mib']} MiB", file=sys.stderr)
        if args.breakdown:
            parts = breakdown(max(counts), template, Path(tmp) / "breakdown")
    print_table(args.trace.name, template, rows)
    report = {"trace": args.trace.name, "trace_mb": round(len(template.text) / 1e6, 1), "events_per_rank": template.events,
              "steps": args.steps, "step_rate": args.step_rate, "rows": rows}
    if len(rows) > 1:
        report["growth"] = growth(rows)
        g = report["growth"]
        print(f"growth {g['ranks']}: time after the last rank x{g['last_done_to_verdict']}, per rank x{g['per_rank_s']}, "
              f"peak RSS x{g['peak_mib']}, increase over idle x{g['increase_mib']}")
    if parts is not None:
        report["breakdown"] = parts
        print(f"finalize_capture, {parts['ranks']} ranks, in a process of its own ({parts['seconds']} s):")
        for name, row in parts["steps"].items():
            print(f"  {name:<40} {row['seconds']:>7.1f} s  peak {row['peak_mib']:>6.0f} MiB (RSS before {row['rss_before_mib']:.0f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
