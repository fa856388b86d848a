"""Captures: one at a time, across every selected engine process, from ``arm`` to a merged trace.

State of a capture (``GET /profile/{id}``):
  armed      probes told; no process has started recording yet
  capturing  at least one process is recording
  exporting  every process has finished; traces are being compressed, merged and analysed
  done       every selected process recorded every step asked for
  partial    some trace exists but something is missing (fewer steps, a process failed, the
             size limit, an early stop); ``reason`` says what
  failed     no trace at all; ``reason`` says why
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import shutil
import time
from collections import OrderedDict
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..protocol import P_ARMED, P_CAPTURING, P_DONE, P_EXPORTING, P_FAILED, CaptureSpec
from . import merge
from .params import CaptureRequest
from .jobs import OneJobAtATime
from .registry import ProbeConnection, ProbeRegistry

log = logging.getLogger(__name__)

ARMED, CAPTURING, EXPORTING, DONE, PARTIAL, FAILED = "armed", "capturing", "exporting", "done", "partial", "failed"
FINAL_STATES = (DONE, PARTIAL, FAILED)
P_LOST = "lost"  # a per-process state only the sidecar gives
P_TERMINAL = (P_DONE, P_FAILED, P_LOST)
STOP_GRACE_S = 10.0  # after a stop request, how long to wait for processes to report
ARM_REPLY_S = 3.0  # how long to wait for every probe to answer "arm" with its step count
BEGIN_LEAD_S = 0.25  # the common start step lies this far ahead at the fastest observed step rate


class CaptureBusy(Exception):
    def __init__(self, active: "Capture") -> None:
        super().__init__(f"capture {active.id} is {active.state}")
        self.active = active


class NoProbes(Exception):
    pass


@dataclass(eq=False)
class ProcessRecord:
    conn: ProbeConnection | None
    label: str
    role: str
    pid: int
    rank: int | None
    stem: str
    step_driven: bool
    state: str = P_ARMED
    steps_recorded: int = 0
    steps_seen: int | None = None  # the process's step count when it was armed
    first_step: int | None = None
    raw_file: str | None = None
    file: str | None = None
    bytes: int = 0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "role": self.role, "pid": self.pid, "rank": self.rank, "label": self.label,
            "state": self.state, "steps_recorded": self.steps_recorded, "first_step": self.first_step,
            "file": self.file, "bytes": self.bytes, "error": self.error,
        }


@dataclass(eq=False)
class Capture:
    id: str
    request: CaptureRequest
    dir: Path
    processes: list[ProcessRecord]
    state: str = ARMED
    reason: str | None = None
    created_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    trace_file: str | None = None
    trace_bytes: int = 0
    headline: str | None = None
    summary_file: str | None = None
    stop_reason: str | None = None
    window_stop_sent: bool = False
    start_step: int | None = None
    notes: list[str] = field(default_factory=list)
    armed_event: asyncio.Event = field(default_factory=asyncio.Event)
    done_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def raw_dir(self) -> Path:
        return self.dir / "raw"

    def spec(self) -> CaptureSpec:
        r = self.request
        return CaptureSpec(
            id=self.id, steps=r.steps, out_dir=str(self.raw_dir), delay=r.delay, activities=r.activities,
            record_shapes=r.record_shapes, with_stack=r.with_stack, profile_memory=r.profile_memory,
            with_flops=r.with_flops,
        )

    def files(self) -> list[str]:
        names = [p.file for p in self.processes if p.file]
        return names + ([self.trace_file] if self.trace_file else [])

    def to_json(self) -> dict[str, Any]:
        r = self.request
        return {
            "id": self.id,
            "state": self.state,
            "reason": self.reason,
            "notes": self.notes,
            "steps": r.steps,
            "start_step": self.start_step,
            "delay": r.delay,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "headline": self.headline,
            "trace": f"/profile/{self.id}/trace" if self.trace_file else None,
            "trace_bytes": self.trace_bytes,
            "summary": f"/profile/{self.id}/summary" if self.summary_file else None,
            "processes": [p.to_json() for p in self.processes],
            "files": {name: f"/profile/{self.id}/files/{name}" for name in self.files()},
            "options": {
                "activities": list(r.activities) or "host default",
                "record_shapes": r.record_shapes, "with_stack": r.with_stack,
                "profile_memory": r.profile_memory, "with_flops": r.with_flops,
                "timeout_s": r.timeout_s,
                "processes": [f"{s.role}:{s.rank}" if s.rank is not None else s.role for s in r.processes] or "all",
            },
        }


def new_capture_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


class CaptureManager(OneJobAtATime):
    def __init__(
        self,
        registry: ProbeRegistry,
        trace_dir: Path,
        executor: Executor,
        max_capture_bytes: int,
        keep: int,
        stop_grace_s: float = STOP_GRACE_S,
        on_finished: Callable[[Capture], None] | None = None,
    ) -> None:
        super().__init__()
        self._on_finished = on_finished
        self._stop_grace_s = stop_grace_s
        self._registry = registry
        self._trace_dir = trace_dir
        self._executor = executor
        self._max_bytes = max_capture_bytes
        self._keep = keep
        self._captures: "OrderedDict[str, Capture]" = OrderedDict()

    # -- queries ------------------------------------------------------------------------------------
    def get(self, capture_id: str) -> Capture | None:
        return self._captures.get(capture_id)

    def recent(self) -> list[Capture]:
        return list(reversed(self._captures.values()))


    # -- start / stop -------------------------------------------------------------------------------
    async def start(self, request: CaptureRequest) -> Capture:
        if self._active is not None:
            raise CaptureBusy(self._active)
        conns = self._registry.all()
        if not conns:
            raise NoProbes("no engine process is connected to the sidecar")
        chosen = [c for c in conns if request.selects(c.identity.role, c.identity.rank)]
        if not any(c.identity.step_driven for c in chosen):
            from .params import ParamError

            have = ", ".join(c.identity.label for c in conns)
            raise ParamError("processes", f"selects no engine core or worker among the connected processes ({have})")
        if "cuda" in request.activities and not any(c.identity.cuda for c in chosen):
            from .params import ParamError

            raise ParamError("activities", "cuda was asked for but no selected process has a CUDA device")
        capture = Capture(
            id=new_capture_id(),
            request=request,
            dir=self._trace_dir / "captures",
            processes=[
                ProcessRecord(conn=c, label=c.identity.label, role=c.identity.role, pid=c.identity.pid,
                              rank=c.identity.rank, stem=c.identity.file_stem, step_driven=c.identity.step_driven)
                for c in chosen
            ],
        )
        capture.dir = self._trace_dir / "captures" / capture.id
        capture.raw_dir.mkdir(parents=True, exist_ok=True)
        self._captures[capture.id] = capture
        self._active = capture
        arm = {"type": "arm", "capture": capture.spec().to_dict()}
        for rec in capture.processes:
            if not await rec.conn.send(arm):
                rec.state, rec.error = P_LOST, "probe unreachable when arming"
        self._spawn(self._watch_timeout(capture))
        self._spawn(self._begin_when_armed(capture))
        await self._maybe_progress(capture)
        return capture

    async def _begin_when_armed(self, capture: Capture) -> None:
        """Second phase of arming: one start step for every process, ahead of all their counts."""
        try:
            await asyncio.wait_for(capture.armed_event.wait(), ARM_REPLY_S)
        except asyncio.TimeoutError:
            pass
        if capture is not self._active or capture.stop_reason is not None:
            return
        replied = [p for p in capture.processes if p.step_driven and p.steps_seen is not None and p.state == P_ARMED]
        for rec in capture.processes:
            if rec.step_driven and rec.state == P_ARMED and rec.steps_seen is None:
                rec.state, rec.error = P_LOST, f"did not answer 'arm' within {ARM_REPLY_S:g} s"
        if replied:
            rate = max(p.conn.step_rate for p in replied)
            lead = 2 + math.ceil(rate * BEGIN_LEAD_S)
            capture.start_step = max(p.steps_seen for p in replied) + lead + capture.request.delay
            begin = {"type": "begin", "capture_id": capture.id, "start_step": capture.start_step}
            for rec in replied:
                if not await rec.conn.send(begin):
                    rec.state, rec.error = P_LOST, "probe unreachable when beginning"
        await self._maybe_progress(capture)

    async def stop(self, reason: str = "stopped by request") -> Capture | None:
        capture = self._active
        if capture is None:
            return None
        await self._request_stop(capture, reason)
        return capture

    async def _request_stop(self, capture: Capture, reason: str) -> None:
        if capture.stop_reason is None:
            capture.stop_reason = reason
        for rec in capture.processes:
            if rec.state in P_TERMINAL:
                continue
            if rec.conn is not None:
                await rec.conn.send({"type": "stop", "capture_id": capture.id, "reason": reason})
        self._spawn(self._give_up_after_grace(capture))
        await self._maybe_progress(capture)

    # -- probe events -------------------------------------------------------------------------------
    async def on_probe_report(self, conn: ProbeConnection, msg: dict[str, Any]) -> None:
        capture = self._captures.get(str(msg.get("capture_id")))
        if capture is None or capture.state in FINAL_STATES or capture.state == EXPORTING:
            return
        rec = next((p for p in capture.processes if p.conn is conn), None)
        if rec is None or rec.state in P_TERMINAL:
            return
        rec.steps_recorded = int(msg.get("steps_recorded") or 0)
        state = msg.get("state")
        if state == P_ARMED and rec.step_driven:
            rec.steps_seen = int(msg.get("steps_seen") or 0)
            if all(p.steps_seen is not None or p.state in P_TERMINAL for p in capture.processes if p.step_driven):
                capture.armed_event.set()
        elif state == P_CAPTURING:
            rec.state = P_CAPTURING
            rec.first_step = msg.get("first_step")
            if rec.step_driven and capture.start_step is not None and rec.first_step != capture.start_step:
                capture.notes.append(
                    f"{rec.label} started at step {rec.first_step}, not {capture.start_step}: "
                    "the begin message reached it late, so its steps differ from the others'")
            if capture.state == ARMED:
                capture.state = CAPTURING
        elif state == P_EXPORTING:
            rec.state = P_EXPORTING
        elif state == P_DONE:
            rec.state, rec.raw_file, rec.bytes = P_DONE, str(msg.get("file") or ""), int(msg.get("bytes") or 0)
        elif state == P_FAILED:
            rec.state, rec.error = P_FAILED, str(msg.get("error") or "failed")
        await self._maybe_progress(capture)

    async def on_probe_lost(self, conn: ProbeConnection) -> None:
        capture = self._active
        if capture is None:
            return
        for rec in capture.processes:
            if rec.conn is conn and rec.state not in P_TERMINAL:
                rec.state, rec.error = P_LOST, "probe disconnected during the capture"
        await self._maybe_progress(capture)

    async def _maybe_progress(self, capture: Capture) -> None:
        if capture is not self._active:
            return
        driven = [p for p in capture.processes if p.step_driven]
        if all(p.state in P_TERMINAL for p in driven) and not capture.window_stop_sent:
            # Step-driven processes are finished: end the API server's window too.
            capture.window_stop_sent = True
            for rec in capture.processes:
                if not rec.step_driven and rec.state not in P_TERMINAL:
                    await rec.conn.send({"type": "stop", "capture_id": capture.id, "reason": "steps recorded"})
            self._spawn(self._give_up_after_grace(capture))
        if all(p.state in P_TERMINAL for p in capture.processes):
            self._active = None
            capture.state = EXPORTING
            self._spawn(self._finalize(capture))

    # -- timers -------------------------------------------------------------------------------------

    async def _give_up_after_grace(self, capture: Capture) -> None:
        await asyncio.sleep(self._stop_grace_s)
        if capture is not self._active:
            return
        for rec in capture.processes:
            if rec.state not in P_TERMINAL:
                rec.state = P_LOST
                rec.error = (
                    "did not stop within the grace period: torch.profiler can only stop on the engine's "
                    "own step, and this process took no step (idle engine?)"
                )
        await self._maybe_progress(capture)

    # -- export -------------------------------------------------------------------------------------
    async def _finalize(self, capture: Capture) -> None:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(
                self._executor, merge.finalize_capture, capture.dir, capture.processes, self._max_bytes
            )
        except Exception as exc:  # a broken trace must not take the sidecar down
            log.exception("capture %s: export failed", capture.id)
            result = merge.FinalizeResult(problems=[f"export failed: {exc}"])
        for rec in capture.processes:
            outcome = result.processes.get(rec.stem)
            if outcome is not None:
                rec.file, rec.bytes = outcome.file, outcome.bytes
                if outcome.error:
                    rec.state, rec.error = P_FAILED, outcome.error
        capture.trace_file, capture.trace_bytes = result.trace_file, result.trace_bytes
        capture.summary_file, capture.headline = result.summary_file, result.headline
        capture.state, capture.reason = self._verdict(capture, result.problems)
        capture.finished_at = time.time()
        capture.done_event.set()
        self._save(capture)
        if self._on_finished is not None:
            self._on_finished(capture)
        self._apply_retention()

    @staticmethod
    def _verdict(capture: Capture, problems: list[str]) -> tuple[str, str | None]:
        reasons = list(problems)
        if capture.stop_reason:
            reasons.insert(0, capture.stop_reason)
        for rec in capture.processes:
            if rec.state != P_DONE:
                reasons.append(f"{rec.label}: {rec.error or rec.state}")
            elif rec.step_driven and rec.steps_recorded < capture.request.steps:
                reasons.append(f"{rec.label}: recorded {rec.steps_recorded} of {capture.request.steps} steps")
        if capture.trace_file is None or not any(r.step_driven and r.state == P_DONE for r in capture.processes):
            # The API server's window alone, without any engine step, answers nothing.
            return FAILED, "; ".join(dict.fromkeys(reasons)) or "no engine step was recorded"
        if reasons:
            return PARTIAL, "; ".join(dict.fromkeys(reasons))
        return DONE, None

    def _save(self, capture: Capture) -> None:
        try:
            (capture.dir / "capture.json").write_text(json.dumps(capture.to_json(), indent=1))
        except OSError as exc:
            log.warning("capture %s: cannot write capture.json: %s", capture.id, exc)

    def _apply_retention(self) -> None:
        finished = [c for c in self._captures.values() if c.state in FINAL_STATES]
        for old in finished[: max(0, len(finished) - self._keep)]:
            self._captures.pop(old.id, None)
            shutil.rmtree(old.dir, ignore_errors=True)


