"""Captures: N working steps of every selected engine process with torch.profiler, merged into one trace.

What is a capture's own, on top of the shared life cycle (manager.py): its directory
(``<trace-dir>/captures/<id>/``; each probe writes its raw trace under its own trace root, in
``<root>/captures/<id>/raw/``, and reports the path), the stop of the API server's window once the
step-driven processes have finished, the compression, merge and analysis on the export executor
(sidecar/service/export/merge.py, which takes the raw files and removes them; a probe that sampled Python stacks left its
samples beside its trace, and their slices and summary are built there too), and ``capture.json``
beside the files. A capture its user stopped before any engine step is ``cancelled``: nothing is
merged, and the API server's raw files are deleted.

A capture bound to a request (``BoundCaptureRequest``, started by request_captures.py) differs in
two ways only: it starts at once (``arming.at_once``: its request waits for every process to be
armed, then runs), and its ``steps`` are a cap: a capture whose processes stopped because the request
ended (``REQUEST_ENDED``) recorded all it was asked for, and is judged on the steps they recorded.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from concurrent.futures import Executor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ...common.protocol import (MAX_ALERT_LABELS, P_DONE, P_FAILED, REQUEST_ENDED, Arm, CaptureReport, StartedBy,
                                Verdict)
from ...common.step_window import clip
from ...stacks import samples_file as stack_samples
from . import arming
from ..export import disk_space, merge
from ..channel import file_fetch
from .arming import ARM_REPLY_S
from .board import JobBoard
from .manager import STOP_GRACE_S, JobManager
from .states import EXPORTING
from .capture import BoundCaptureRequest, Capture, CaptureProcess, capture_url
from .capture_index import restore_captures, save_capture_json
from .stored_captures import StoredCaptures
from .storing import JobStore, capture_upload, waiting
from ..store.uploads import Upload
from .model import CAPTURE
from .params import CaptureRequest, ParamError
from ..export.process_stems import unique_stems
from ..channel.registry import ProbeRegistry

log = logging.getLogger(__name__)


class CaptureManager(JobManager[Capture]):
    kind = CAPTURE

    def __init__(
        self,
        registry: ProbeRegistry,
        board: JobBoard,
        trace_dir: Path,
        executor: Executor,
        *,
        max_capture_bytes: int,
        keep: int,
        keep_bytes: int | None = None,
        min_free_bytes: int = disk_space.MIN_FREE_BYTES,
        stop_grace_s: float = STOP_GRACE_S,
        arm_reply_s: float = ARM_REPLY_S,
        on_finished: Callable[[Capture], None] | None = None,
        store: JobStore | None = None,
    ) -> None:
        super().__init__(registry, board, keep=keep, keep_bytes=keep_bytes, stop_grace_s=stop_grace_s,
                         arm_reply_s=arm_reply_s, on_finished=on_finished, store=store)
        self._trace_dir = trace_dir
        self._executor = executor
        self._max_bytes = max_capture_bytes
        self._min_free_bytes = min_free_bytes
        # With a store, the captures it holds and the local disk does not (stored_captures.py).
        self._stored = StoredCaptures(store, trace_dir, max_capture_bytes) if store is not None else None
        self._removals: set[str] = set()  # retained away while their upload had not ended: removed when it does
        # The disk is the truth: what an earlier run of the sidecar left is listed, served and retained.
        self._adopt(restore_captures(trace_dir))

    def _create(self, request: CaptureRequest) -> Capture:
        chosen = self._select(request)
        if "cuda" in request.activities and not any(c.identity.cuda for c in chosen):
            raise ParamError("activities", "cuda was asked for but no selected process has a CUDA device")
        left_out = []
        if request.backend == "nsys":
            chosen, left_out = _nsys_processes(chosen)
        # A capture on a full disk fails late and leaves half-written files: refuse it now.
        disk_space.ensure_room(self._trace_dir, self._min_free_bytes)
        capture_id = self.kind.new_id()
        bound = None
        if isinstance(request, BoundCaptureRequest):
            bound = {"id": request.request_id, "max_steps": request.steps, "asked_by": request.asked_by}
        capture = Capture(
            id=capture_id, request=request, dir=self._trace_dir / "captures" / capture_id,
            processes=[CaptureProcess(conn=c, identity=c.identity, unique_stem=stem)
                       for c, stem in zip(chosen, unique_stems([(c.identity, c.shares_files) for c in chosen]))],
            bound_request=bound,
        )
        capture.notes.extend(left_out)
        capture.dir.mkdir(parents=True, exist_ok=True)
        # Written now, not only at the end: a sidecar killed during the capture leaves what was asked
        # and of which processes, for the restarted one to list it truthfully (capture_index.py).
        self._save(capture)
        return capture

    def _waits_for_returns(self, request: CaptureRequest) -> bool:
        """Not a request's own capture: that request waits for it (request_captures.py)."""
        return not isinstance(request, BoundCaptureRequest)

    def _arm_message(self, capture: Capture) -> Arm:
        return Arm(spec=capture.spec())

    def _start_step(self, capture: Capture, replied: list[CaptureProcess]) -> tuple[int, float | None]:
        if capture.bound_request is not None:  # its request runs as soon as every process is armed
            return arming.at_once(p.steps_seen for p in replied), None
        return super()._start_step(capture, replied)

    async def stop_capture(self, capture: Capture, reason: str) -> None:
        """Stop ``capture`` if it still runs (a released request capture); another job is left alone."""
        if capture is self.active:
            await self._request_stop(capture, reason)

    def _take_result(self, capture: Capture, rec: CaptureProcess, report: CaptureReport) -> None:
        rec.raw_file, rec.bytes = report.file or "", report.bytes
        rec.stacks, rec.stacks_file = report.stacks, report.stacks_file
        rec.step_thread_ms, rec.export_ms = report.step_thread_ms, report.export_ms
        rec.nsys = report.nsys
        if rec.conn is not None:
            rec.clock, rec.clock_correction_ns = rec.conn.clock.to_json(), rec.conn.clock.correction_ns
            if not rec.conn.shares_files and (rec.raw_file or rec.stacks_file):
                # Fetched now, while the process is surely there, not when every process is done.
                capture.fetches.append(asyncio.ensure_future(self._fetch_files(capture, rec)))
        if report.stack_summary is not None:  # the probe's own word: its samples were not saved
            self._take_stack_summary(capture, rec, report.stack_summary)

    @staticmethod
    def _take_stack_summary(capture: Capture, rec: CaptureProcess, summary: dict[str, Any]) -> None:
        rec.stack_summary = summary
        cut_short = summary.get("stop_reason")
        if cut_short:  # the sampler's own bound ended it before the steps did
            capture.notes.append(f"{rec.label}: python stacks stopped early ({cut_short}); the steps were recorded")
        if summary.get("error"):
            capture.notes.append(f"{rec.label}: {summary['error']}; the trace was kept")

    async def _on_progress(self, capture: Capture) -> None:
        # The API server records a time window, not steps: it ends when the step-driven processes have.
        if capture.window_stop_sent or not capture.all_ended(capture.step_driven):
            return
        capture.window_stop_sent = True
        windows = [p for p in capture.processes if not p.step_driven and not p.ended]
        await self._send_stop(capture, windows, "steps recorded")

    async def _finish(self, capture: Capture) -> None:
        capture.advance(EXPORTING)
        self._spawn(self._export(capture))

    def _verdict(self, capture: Capture) -> Verdict:
        """What the capture's processes are told when it ends (the API server's capture span)."""
        driven = [p.steps_recorded for p in capture.step_driven]
        return Verdict(
            job_id=capture.id, state=capture.state, reason=clip(capture.reason) if capture.reason else None,
            steps=min(driven) if driven else 0, processes=len(capture.processes), trace_bytes=capture.trace_bytes,
            trace=f"{capture_url(capture.id)}/trace" if capture.trace_file else None, started_by=started_by(capture))

    async def _cancel(self, capture: Capture) -> None:
        # Only the API server's window can have recorded: time, no engine step. Its raw file is
        # deleted unmerged. A few unlinks, done here: the export executor may be busy merging an
        # earlier capture, and the stop's answer waits for this one's end.
        raws = [merge.raw_trace_path(capture.dir, p.raw_file) for p in capture.processes if p.raw_file]
        raws += [merge.raw_samples_path(capture.dir, p.stacks_file) for p in capture.processes if p.stacks_file]
        merge.remove_raw(capture.dir, [raw for raw in raws if raw is not None])
        for rec in capture.processes:
            rec.raw_file, rec.stacks_file, rec.bytes = None, None, 0
        await super()._cancel(capture)

    async def _fetch_files(self, capture: Capture, rec: CaptureProcess) -> None:
        """Bring a remote process's raw trace (and samples) into this capture's raw folder, where the
        merge reads a local process's; a file that does not arrive fails that process, not the capture."""
        raw_dir = capture.dir / merge.RAW_DIR
        remote_trace, remote_samples = rec.raw_file, rec.stacks_file
        rec.raw_file, rec.stacks_file = None, None  # never a path on another host's disk
        try:
            if remote_trace:
                target = raw_dir / f"{rec.stem}.json"
                await file_fetch.fetch_file(rec.conn, remote_trace, target, self._max_bytes)
                rec.raw_file = str(target)
            if remote_samples:
                target = raw_dir / f"{rec.stem}{stack_samples.SUFFIX}"
                try:
                    await file_fetch.fetch_file(rec.conn, remote_samples, target, self._max_bytes)
                    rec.stacks_file = str(target)
                except file_fetch.FetchError as exc:  # the stacks are lost, never the trace
                    rec.stack_summary = {"error": f"python stacks lost: samples not received: {exc}"}
        except file_fetch.FetchError as exc:
            log.warning("capture %s: %s: trace not received: %s", capture.id, rec.label, exc)
            if rec.state == P_DONE:
                capture.move(rec, P_FAILED, f"trace not received from the process: {exc}")

    async def _export(self, capture: Capture) -> None:
        if capture.request.backend == "nsys":  # nothing to merge: the report is nsys's, on the engine's host
            _judge_by_the_request(capture)
            self._conclude(capture, [], has_result=any(p.state == P_DONE for p in capture.step_driven))
            return
        loop = asyncio.get_running_loop()
        if capture.fetches:
            await asyncio.gather(*capture.fetches, return_exceptions=True)
        try:
            result = await loop.run_in_executor(
                self._executor, merge.finalize_capture, capture.dir, capture.processes, self._max_bytes)
        except Exception as exc:  # a broken trace must not take the sidecar down
            log.exception("capture %s: export failed", capture.id)
            result = merge.FinalizeResult(problems=[f"export failed: {disk_space.describe(exc)}"])
        for rec in capture.processes:
            outcome = result.processes.get(rec.stem)
            if outcome is not None:
                rec.file, rec.bytes = outcome.file, outcome.bytes
                if outcome.stack_summary is not None:
                    self._take_stack_summary(capture, rec, outcome.stack_summary)
                if outcome.error and rec.state == P_DONE:  # its file was unusable or over the size limit
                    capture.move(rec, P_FAILED, outcome.error)
        capture.trace_file, capture.trace_bytes = result.trace_file, result.trace_bytes
        capture.summary_file, capture.headline = result.summary_file, result.headline
        # The API server's window alone, without any engine step, answers nothing.
        has_result = capture.trace_file is not None and any(p.state == P_DONE for p in capture.step_driven)
        _judge_by_the_request(capture)
        self._conclude(capture, result.problems, has_result=has_result)

    def _save(self, capture: Capture) -> None:
        save_capture_json(capture)

    def _remove(self, capture: Capture) -> None:
        if self._stored is not None and waiting(capture.stored):
            # Not before its upload ends (at most the queue's bound of captures wait so): what retention
            # removes while the store is down would otherwise be lost. Listed meanwhile, from its local files.
            self._removals.add(capture.id)
            self._stored.keep_listed(capture)
            return
        shutil.rmtree(capture.dir, ignore_errors=True)
        if self._stored is not None:  # retention is the local copy's; the stored one stays listed
            self._stored.retained_locally(capture)

    def _upload(self, capture: Capture) -> Upload:
        return capture_upload(self._store, capture, self._upload_changed)

    def _upload_changed(self, capture: Capture) -> None:
        """Its upload moved on: saved again; a capture retention removed meanwhile goes once it ended."""
        if capture.id in self._removals and not waiting(capture.stored):
            self._removals.discard(capture.id)
            self._stored.forget(capture)
            self._remove(capture)
        else:
            self._save(capture)

    # -- the object store's captures (sidecar serve --store) --------------------------------------------
    def get(self, job_id: str) -> Capture | None:
        found = super().get(job_id)
        if found is None and self._stored is not None:
            found = self._stored.get(job_id)
        return found

    def recent(self) -> list[Capture]:
        """This sidecar's captures, and with a store those it lists from there, newest first."""
        local = super().recent()
        if self._stored is None:
            return local
        self._stored.relist_if_stale(self._spawn, self._jobs)
        return sorted([*local, *self._stored.recent(self._jobs)], key=lambda c: (c.created_at, c.id), reverse=True)

    async def list_stored(self) -> None:
        """List the store's captures (at start, in the background); nothing without a store."""
        if self._stored is not None:
            await self._stored.relist(self._jobs)

    async def ensure_local(self, capture: Capture, name: str) -> None:
        """The file ``name`` of ``capture`` on the local disk: downloaded from the store when only there
        (raises ``FetchFailed``); nothing when it is local or the capture was never stored."""
        if self._stored is not None:
            await self._stored.ensure_local(capture, name, self._adopt_fetched)

    def _adopt_fetched(self, capture: Capture) -> None:
        """A stored capture fetched back: local again, the newest in the cache's retention."""
        self._jobs[capture.id] = capture
        self._retain()

    def _footprint(self, capture: Capture) -> int:
        return disk_space.tree_bytes(capture.dir)


def started_by(capture: Capture) -> StartedBy | None:
    """The trigger or the alert that started ``capture``, as its verdict names it (None: a client did)."""
    if capture.alert:
        alert = capture.alert
        return StartedBy(kind="alert", name=clip(str(alert.get("name") or "")), id=clip(str(alert.get("fingerprint") or "")),
                         starts_at=clip(str(alert.get("starts_at") or "")) or None,
                         labels={clip(str(k)): clip(str(v))
                                 for k, v in list((alert.get("labels") or {}).items())[:MAX_ALERT_LABELS]})
    if capture.trigger:
        trigger = capture.trigger
        return StartedBy(kind="trigger", name=clip(str(trigger.get("name") or "")), id=clip(str(trigger.get("trigger") or "")))
    return None


def _nsys_processes(chosen: list) -> tuple[list, list[str]]:
    """An nsys capture's processes among ``chosen``: the step-driven ones with CUDA (each marks its
    steps with NVTX ranges; sidecar/probe/capture/nsys.py), and a note for each left out. A 400 when
    none is left: on a host without CUDA there is no nsys timeline to mark."""
    kept = [c for c in chosen if c.identity.step_driven and c.identity.cuda]
    if not kept:
        have = ", ".join(f"{c.identity.label}{'' if c.identity.cuda else ' (no CUDA)'}" for c in chosen)
        raise ParamError("backend", f"nsys needs an engine core or worker with CUDA; the selected processes "
                                    f"have none ({have})")
    notes = [f"{c.identity.label}: not in an nsys capture ("
             f"{'no steps to mark' if not c.identity.step_driven else 'no CUDA'})" for c in chosen if c not in kept]
    return kept, notes


def _judge_by_the_request(capture: Capture) -> None:
    """A bound capture whose processes stopped because its request ended asked for the steps they
    recorded (the fewest, when a busy engine made one process begin a step later): the verdict then
    finds nothing missing. Its cap stays in ``bound_request``."""
    if capture.bound_request is None:
        return
    ended = [p.steps_recorded for p in capture.step_driven
             if p.state == P_DONE and p.stop_reason == REQUEST_ENDED and p.steps_recorded > 0]
    if ended:
        capture.request = replace(capture.request, steps=min(ended))
