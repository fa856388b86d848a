"""The life cycle every job kind shares, written once: ``JobManager``.

start   the board checks no job of any kind runs (``JobBusy``), the kind validates and builds the
        job, every selected probe gets the kind's arm message
arm     every step-driven probe answers "armed" with its working-step count, or is lost after
        ``ARM_REPLY_S``; then one ``begin`` with the common start step (arming.py, where ``delay``
        applies) goes to those that answered
run     the probes' reports move each process through the kind's table (states.py); a report
        that may not follow the process's state is dropped whole
stop    a stop request (or the timeout) sends ``stop`` and gives the processes ``stop_grace_s`` to
        report; those that do not are lost
finish  when every process has ended the job leaves the one-job slot and the kind finishes it
        (``_finish``: a capture exports, a scan merges), then ``_conclude`` gives the verdict; or,
        when its user stopped it before any step-driven process recorded (jobs.cancelled), the kind
        drops what it holds (``_cancel``) and the job is ``cancelled``, never judged. Either way
        ``_settle`` saves it, tells ``on_finished`` and keeps only the newest ``keep`` finished jobs
        of the kind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Generic, Iterable, TypeVar

from ...common.protocol import P_ARMED, P_DONE, P_FAILED, Begin, FromSidecar, JobReport, ProcessIdentity, Stop
from . import arming
from .states import ARMED, CANCELLED, FINAL, P_LOST
from .model import CANCELLED_REASON, Job, JobKind, NoProbes, ProcessRun, cancelled, verdict
from .params import JobRequest, ParamError
from .storing import waiting
from ..channel.registry import ProbeConnection, ProbeRegistry

if TYPE_CHECKING:
    from .board import JobBoard
    from .storing import JobStore
    from ..store.uploads import Upload

log = logging.getLogger(__name__)

J = TypeVar("J", bound=Job)

STOP_GRACE_S = 10.0  # after a stop request, how long processes have to report before they are lost
# How long a user's stop of an armed job waits for the job to end before it answers: armed probes
# end at once on a stop, so the answer can be the final state ("cancelled") rather than "armed".
STOP_REPLY_S = 2.0


class JobManager(Generic[J]):
    kind: ClassVar[JobKind]

    def __init__(
        self,
        registry: ProbeRegistry,
        board: "JobBoard",
        *,
        keep: int,
        keep_bytes: int | None = None,
        stop_grace_s: float = STOP_GRACE_S,
        arm_reply_s: float = arming.ARM_REPLY_S,
        arm_reply_alive_s: float = arming.ARM_REPLY_ALIVE_S,
        on_finished: Callable[[J], None] | None = None,
        store: "JobStore | None" = None,
    ) -> None:
        self._registry = registry
        self._store = store  # the object store (sidecar serve --store), None: the local disk alone
        self._board = board
        self._keep = keep
        self._keep_bytes = keep_bytes
        self._grace_s = stop_grace_s
        self._arm_reply_s = arm_reply_s
        self._arm_reply_alive_s = arm_reply_alive_s
        self._on_finished = on_finished
        self._jobs: "OrderedDict[str, J]" = OrderedDict()
        self._active: J | None = None
        self._tasks: set[asyncio.Task] = set()
        board.add(self)

    # -- what a kind provides ----------------------------------------------------------------------
    def _create(self, request: Any) -> J:
        """Validate ``request`` against the connected processes (``ParamError``, ``NoProbes``) and
        build the job; nothing is sent yet."""
        raise NotImplementedError

    def _arm_message(self, job: J) -> FromSidecar:
        raise NotImplementedError

    def _take_result(self, job: J, rec: Any, report: JobReport) -> None:
        """A process reported "done": keep what the kind needs of the report."""

    async def _on_progress(self, job: J) -> None:
        """Called on every change of a running job, before the check for its end."""

    async def _finish(self, job: J) -> None:
        """Every process has ended and the job has left the slot: produce its result and call
        ``_conclude``."""
        raise NotImplementedError

    async def _cancel(self, job: J) -> None:
        """Every process has ended, none recorded a step, and the user asked for the stop: drop
        whatever the job holds (a kind's override) and end it ``cancelled``."""
        self._settle(job, CANCELLED, CANCELLED_REASON)

    def _save(self, job: J) -> None:
        raise NotImplementedError

    def _remove(self, job: J) -> None:
        """Delete what the job left on disk (retention)."""
        raise NotImplementedError

    def _footprint(self, job: J) -> int:
        """Bytes the finished job holds on disk (retention by size)."""
        return 0

    def _upload(self, job: J) -> "Upload | None":
        """The upload of a finished job to the object store (sets ``job.stored``); None: the kind uploads none."""
        return None

    # -- queries -----------------------------------------------------------------------------------
    @property
    def active(self) -> J | None:
        """The job of this kind that has not yet ended in every process (None while one exports)."""
        return self._active

    def get(self, job_id: str) -> J | None:
        return self._jobs.get(job_id)

    def recent(self) -> list[J]:
        return list(reversed(self._jobs.values()))

    # -- start and stop ----------------------------------------------------------------------------
    async def start(self, request: JobRequest) -> J:
        if self._waits_for_returns(request):
            # A link the sidecar dropped lately (a missed heartbeat on a starved host) is back within
            # the probe's backoff: the job picks its processes after, not 30 ms before.
            await self._registry.wait_for_returns()
        self._board.ensure_free()
        job = self._create(request)
        self._name_the_lost(job, request)
        # No await between the check and here: a second start cannot slip in.
        self._jobs[job.id] = job
        self._active = job
        arm = self._arm_message(job)
        job.armed_at = time.monotonic()
        for rec in job.processes:
            if not await rec.conn.send(arm):
                job.move(rec, P_LOST, "probe unreachable when arming")
        self._spawn(self._watch_timeout(job))
        self._spawn(self._begin_when_armed(job))
        await self._progress(job)
        return job

    def _select(self, request: JobRequest) -> list[ProbeConnection]:
        """The connected processes ``request`` selects; at least one must be step-driven. Window
        processes (an API server) record the time the step-driven ones record, where the kind can."""
        conns = self._registry.all()
        if not conns:
            raise NoProbes("no engine process is connected to the sidecar")
        chosen = [c for c in conns if request.selects(c.identity.role, c.identity.rank, c.identity.instance)]
        if request.instance is not None and not chosen:
            have = ", ".join(sorted({c.identity.instance or '""' for c in conns}))
            raise ParamError("instance", f"no connected process belongs to {request.instance!r} (instances: {have})")
        if not any(c.identity.step_driven for c in chosen):
            have = ", ".join(c.identity.label for c in conns)
            raise ParamError("processes", f"selects no engine core or worker among the connected processes ({have})")
        return chosen if self.kind.window_processes else [c for c in chosen if c.identity.step_driven]

    def _selects(self, request: JobRequest, identity: ProcessIdentity) -> bool:
        return (request.selects(identity.role, identity.rank, identity.instance)
                and (identity.step_driven or self.kind.window_processes))

    def _waits_for_returns(self, request: JobRequest) -> bool:
        """Whether the start waits (``RETURN_WAIT_S`` at most) for processes whose link just dropped."""
        return True

    def _name_the_lost(self, job: J, request: JobRequest) -> None:
        """A process the request selects whose link dropped lately and is not back is not in the job:
        said in its notes, not left for the reader to count (a capture otherwise ends "done")."""
        now = time.monotonic()
        for lost in self._registry.recently_lost():
            if self._selects(request, lost.identity):
                job.notes.append(f"{lost.identity.label} lost its link to the sidecar {now - lost.lost_at:.1f} s "
                                 f"before this {self.kind.name} began and had not reconnected: it is not in it")

    async def stop(self, reason: str = "stopped by request") -> J | None:
        """The user's stop of the running job (None: none runs). A job that has recorded no step
        yet is given ``STOP_REPLY_S`` to end, so that the caller reads its true state: mostly
        ``cancelled``, else still ``armed``."""
        job = self._active
        if job is None:
            return None
        if job.stop_reason is None:  # after the timeout's stop, the timeout remains the cause
            job.stopped_by_user = True
        await self._request_stop(job, reason)
        if job.stopped_by_user and job.state == ARMED:
            try:
                await asyncio.wait_for(job.done_event.wait(), STOP_REPLY_S)
            except asyncio.TimeoutError:
                pass
        return job

    async def _request_stop(self, job: J, reason: str) -> None:
        if job.stop_reason is None:
            job.stop_reason = reason
        await self._send_stop(job, [p for p in job.processes if not p.ended], reason)
        await self._progress(job)

    async def _send_stop(self, job: J, processes: list[ProcessRun], reason: str) -> None:
        stop = Stop(job_id=job.id, reason=reason)
        for rec in processes:
            if rec.conn is not None:
                await rec.conn.send(stop)
        self._spawn(self._give_up_after_grace(job))

    # -- the second phase of arming ------------------------------------------------------------------
    async def _begin_when_armed(self, job: J) -> None:
        sent_at = time.time()  # the arms have left: a heartbeat received after this shows a process alive
        try:
            await asyncio.wait_for(job.armed_event.wait(), self._arm_reply_s)
        except asyncio.TimeoutError:
            await self._wait_for_the_living(job, sent_at)
        if job is not self._active or job.stop_reason is not None:
            return
        replied = [p for p in job.step_driven if p.steps_seen is not None and p.state == P_ARMED]
        waited = time.monotonic() - job.armed_at
        within = f"{self._arm_reply_s:g} s" if waited < self._arm_reply_s + 0.5 else f"{waited:.1f} s (alive)"
        for rec in job.step_driven:
            if rec.state == P_ARMED and rec.steps_seen is None:
                job.move(rec, P_LOST, f"did not answer 'arm' within {within}")
        # Each engine instance counts its own steps (two servers sharing this sidecar, data-parallel
        # engine cores): one start step per instance, ahead of that instance's counts.
        for instance, members in arming.by_instance(replied).items():
            start, lead_s = self._start_step(job, members)
            job.start_steps[instance] = start
            begin = Begin(job_id=job.id, start_step=start)
            for rec in members:
                rec.start_step, rec.lead_s = start, lead_s
                if not await rec.conn.send(begin):
                    job.move(rec, P_LOST, "probe unreachable when beginning")
        job.start_step = next(iter(job.start_steps.values())) if len(job.start_steps) == 1 else None
        await self._progress(job)

    async def _wait_for_the_living(self, job: J, sent_at: float) -> None:
        """Past ``arm_reply_s``, wait on while some process that has not answered has sent a heartbeat
        since its arm left (alive, its answer late: a loaded host), up to ``arm_reply_alive_s`` after
        the arm; a process silent since then is lost as before."""
        deadline = job.armed_at + max(self._arm_reply_s, self._arm_reply_alive_s)
        while not job.armed_event.is_set() and job is self._active and job.stop_reason is None:
            unanswered = [r for r in job.step_driven if r.state == P_ARMED and r.steps_seen is None]
            left = deadline - time.monotonic()
            if left <= 0 or not any(r.conn is not None and r.conn.last_seen >= sent_at for r in unanswered):
                return
            try:  # looked at again every half second: a process may fall silent meanwhile
                await asyncio.wait_for(job.armed_event.wait(), min(left, 0.5))
            except asyncio.TimeoutError:
                pass

    def _start_step(self, job: J, replied: list[ProcessRun]) -> tuple[int, float | None]:
        """The start step sent in ``begin`` to ``replied``, the processes of one engine instance, and
        its lead in seconds (arming.py); a kind may start its jobs otherwise (lead None: none)."""
        # Each process's own rate at arm and the rate its heartbeats gave: right after a (re)connect
        # only the first exists.
        fastest = arming.fastest_rate([p.conn.step_rate for p in replied] + [p.step_rate for p in replied])
        slowest_reply = max((p.arm_round_trip_s or 0.0 for p in replied), default=None)
        lead_s = arming.lead_seconds(slowest_reply, max(p.conn.begin_took_s for p in replied))
        since_arm = time.monotonic() - job.armed_at
        counts = [arming.projected(p.steps_seen, fastest, since_arm - (p.arm_round_trip_s or 0.0)) for p in replied]
        return arming.start_step(counts, fastest, job.request.delay, lead_s), lead_s

    # -- probe events ------------------------------------------------------------------------------
    async def on_report(self, conn: ProbeConnection, report: JobReport) -> None:
        job = self._jobs.get(report.job_id)
        if job is None or job is not self._active:
            return  # a late report: the job has ended in every process
        rec = next((p for p in job.processes if p.conn is conn), None)
        if rec is None or rec.ended:
            return  # not selected, or already given up on (lost)
        if report.state != rec.state and not job.can_move(rec, report.state):
            log.warning("%s %s: %s reported %r while %r; report dropped",
                        self.kind.name, job.id, rec.label, report.state, rec.state)
            return
        rec.steps_recorded = report.steps_recorded
        if report.stop_reason:
            rec.stop_reason = report.stop_reason
        if report.state == P_ARMED:
            self._on_armed(job, rec, report)
        elif report.state != rec.state:
            self._enter(job, rec, report)
        await self._progress(job)

    def _on_armed(self, job: J, rec: ProcessRun, report: JobReport) -> None:
        if not rec.step_driven:
            return  # a window process starts at "arm"; it has no start step to agree on
        rec.steps_seen = report.steps_seen or 0
        rec.step_rate = report.step_rate
        rec.arm_round_trip_s = time.monotonic() - job.armed_at
        if report.steps_seen is not None:
            # The probe's count as of now: with a heartbeat's, a rate where none was measured yet (a
            # capture right after the sidecar's restart, before the second heartbeat).
            rec.conn.observe_steps(report.steps_seen, time.time())
        if all(p.steps_seen is not None or p.ended for p in job.step_driven):
            job.armed_event.set()

    def _enter(self, job: J, rec: ProcessRun, report: JobReport) -> None:
        if report.state == self.kind.running:
            job.move(rec, report.state)
            rec.first_step = report.first_step
            if rec.step_driven and rec.start_step is not None and rec.first_step != rec.start_step:
                job.notes.append(
                    f"{rec.label} started at step {rec.first_step}, not {rec.start_step}: "
                    "the begin message reached it late, so its steps differ from the others'")
            if rec.step_driven:
                self._learn_begin_latency(rec)
            # An API server's window opens at "arm": only a step-driven process records steps.
            if job.state == ARMED and rec.step_driven:
                job.advance(self.kind.running)
        elif report.state == P_FAILED:
            job.move(rec, P_FAILED, report.error or "failed")
        else:
            job.move(rec, report.state)
            if report.state == P_DONE:
                self._take_result(job, rec, report)

    @staticmethod
    def _learn_begin_latency(rec: ProcessRun) -> None:
        """How long a begin took to reach ``rec``, kept on its connection for the next job's lead
        (``arming.learned``: one that came late raises it, one on time lets a past slow spell fade)."""
        conn = rec.conn
        if rec.lead_s is None or conn is None or rec.first_step is None or rec.start_step is None:
            return
        conn.begin_took_s = arming.learned(conn.begin_took_s, rec.lead_s, rec.first_step - rec.start_step,
                                           conn.step_rate or rec.step_rate)

    async def on_probe_lost(self, conn: ProbeConnection) -> None:
        job = self._active
        if job is None:
            return
        for rec in job.processes:
            if rec.conn is conn and not rec.ended:
                job.move(rec, P_LOST, f"probe disconnected during the {self.kind.name}")
        await self._progress(job)

    # -- the end -----------------------------------------------------------------------------------
    async def _progress(self, job: J) -> None:
        if job is not self._active:
            return
        await self._on_progress(job)
        # Checked again: ``_on_progress`` may wait, and another event may have ended the job.
        if job is self._active and job.all_ended():
            self._active = None
            if cancelled(job):
                await self._cancel(job)
            else:
                await self._finish(job)

    def _conclude(self, job: J, problems: list[str], *, has_result: bool) -> None:
        self._settle(job, *verdict(job, problems, has_result=has_result))

    def _settle(self, job: J, state: str, reason: str | None) -> None:
        """The job's final state: saved, told to ``on_finished``, then retention."""
        job.advance(state)
        job.reason = reason
        job.finished_at = time.time()
        job.done_event.set()
        # Its ``stored`` is set before the save, so that a sidecar stopped before the upload queues it again.
        upload = self._upload(job) if self._store is not None and state != CANCELLED else None
        self._save(job)
        if upload is not None:
            self._store.uploader.submit(upload)  # a deque append: the upload runs in the background
        if self._on_finished is not None:
            try:  # metrics and spans about a job must not stop its retention or its probe's channel
                self._on_finished(job)
            except Exception:
                log.exception("%s %s: on_finished failed", self.kind.name, job.id)
        verdict_msg = self._verdict(job)
        if verdict_msg is not None:
            self._spawn(self._announce(job, verdict_msg))
        self._retain()

    def _verdict(self, job: J) -> FromSidecar | None:
        """The message that tells a job's processes its final state (None: the kind sends none)."""
        return None

    async def _announce(self, job: J, msg: FromSidecar) -> None:
        """Send ``msg`` to every process of ``job`` still connected; one that is not is skipped."""
        for rec in job.processes:
            if rec.conn is not None and rec.state != P_LOST:
                await rec.conn.send(msg)

    def _adopt(self, saved: Iterable[J]) -> None:
        """Jobs an earlier run of the sidecar ended (read back from disk by the kind): listed,
        served and retained as this run's are, oldest first. Called once, at construction."""
        for job in sorted(saved, key=lambda j: (j.created_at, j.id)):
            self._jobs.setdefault(job.id, job)
        self._retain()
        if self._store is not None:  # uploads the earlier run had not finished: queued again
            for job in self._jobs.values():
                if waiting(job.stored) and (upload := self._upload(job)) is not None:
                    self._save(job)
                    self._store.uploader.submit(upload)

    def _retain(self) -> None:
        """Keep the newest finished jobs while there are at most ``keep`` of them and they hold at
        most ``keep_bytes`` on disk; delete the older ones. The newest always stays, whatever its
        size: the user has just asked for it (and the kind's own limit bounds it)."""
        finished = [j for j in self._jobs.values() if j.state in FINAL]
        kept, total = 0, 0
        for job in reversed(finished):
            if kept < self._keep and self._keep_bytes is not None:
                total += self._footprint(job)
            if kept < self._keep and (kept == 0 or self._keep_bytes is None or total <= self._keep_bytes):
                kept += 1
                continue
            kept = self._keep  # everything older goes too: retention never leaves a gap
            del self._jobs[job.id]
            self._remove(job)

    # -- timers ------------------------------------------------------------------------------------
    async def _give_up_after_grace(self, job: J) -> None:
        await asyncio.sleep(self._grace_s)
        if job is not self._active:
            return
        for rec in job.processes:
            if not rec.ended:
                job.move(rec, P_LOST, self.kind.grace_error)
        await self._progress(job)

    async def _watch_timeout(self, job: J) -> None:
        try:
            await asyncio.wait_for(job.done_event.wait(), job.request.timeout_s)
        except asyncio.TimeoutError:
            if job is self._active:
                await self._request_stop(job, f"timeout after {job.request.timeout_s:g} s")

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_ended)

    def _task_ended(self, task: asyncio.Task) -> None:
        # A job's background task that raised is a sidecar bug (a TransitionError, say): say so now,
        # not when the task is collected.
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: background task failed", self.kind.name, exc_info=task.exception())

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
