"""N simulated GPU worker ranks on the real probe channel, and the raw traces they report.

What bench_many_ranks.py (and tests/test_many_ranks.py) drive a real sidecar with: N worker ranks
that speak the probe channel (sidecar/common/protocol.py) from one asyncio loop, as a probe does: the
handshake (``hello`` with the probe's trace root and marker, so the sidecar reads the files where
they lie, ``challenge``, ``proof``), heartbeats with a working-step count that advances at one rate
in every rank alike (as the ranks of one engine count the same steps), ``clock_reply``, and the
capture's reports (``armed`` with the step count, ``capturing`` at the start step, ``exporting``,
``done`` with the raw trace). Each rank's raw trace is one real Kineto trace rewritten for that rank
(``TraceTemplate``): its own host pid, ``distributedInfo`` rank and world size, and a base time a
quarter of a millisecond after the previous rank's. The files are written before the capture starts
and moved into ``<root>/captures/<id>/raw/`` when a rank reports ``done``, as a probe's export leaves
them: what is measured is the sidecar, not the disk.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import socket
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from sidecar.common import auth
from sidecar.probe.capture.trace_root import TraceRoot
from sidecar.common.protocol import (PROBE_WS_PATH, Arm, Begin, CaptureReport, Challenge, ClockProbe, ClockReply, Heartbeat,
                              Hello, ProcessIdentity, Proof, Stop, Verdict)
from sidecar.common.protocol_codec import PROTOCOL_VERSION, decode_from_sidecar, encode

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
    from sidecar.analysis.reader.stream import TopLevel, read_events

    names = {}
    for batch in read_events(str(gz_path), TopLevel(), Any, keep=frozenset()):
        for ev in batch:
            if ev.get("ph") == "M" and ev.get("name") == "process_name":
                names[ev["pid"]] = ev["args"]["name"]
    return names
