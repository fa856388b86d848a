"""The job model captures and sync scans share: kinds, ids, errors, the per-process record (and its
JSON, both ways), the verdict.

A job runs in some connected engine processes at once. The life cycle that drives it (arming,
the common start step, stop requests, grace period, timeout, retention) is in manager.py; what
is particular to a kind (a capture's trace directory and merge, a scan's baseline and site merge) is
in captures.py and scans.py.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Self

from ...engine import STANDARD_ROLES
from ...common.protocol import CaptureReport, ModuleReport, P_ARMED, P_DONE, ProcessIdentity, SyncReport
from ...common.protocol import MemoryReport
from . import states as st

if TYPE_CHECKING:
    from ..channel.registry import ProbeConnection


@dataclass(frozen=True)
class JobKind:
    name: str  # "capture": in reasons ("probe disconnected during the capture")
    id_prefix: str  # ids are unique across kinds: the probes' "begin" and "stop" serve every kind
    running: str  # the job's and its processes' state while recording
    states: st.Table
    process_states: st.Table
    report: type  # the probe's report struct for this kind
    recorded: str  # the verb of a shortfall: "recorded 3 of 5 steps"
    grace_error: str  # why a process that did not stop in the grace period is lost
    # Whether window processes (an API server) take part, recording the time the step-driven ones record.
    window_processes: bool = False

    def new_id(self) -> str:
        """``YYYYmmdd-HHMMSS-xxxxxx`` (UTC, 3 random bytes) after the kind's prefix (docs/api.md)."""
        return self.id_prefix + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)

    def is_id(self, text: str) -> bool:
        return re.fullmatch(re.escape(self.id_prefix) + r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}", text) is not None


CAPTURE = JobKind(
    name="capture", id_prefix="", running=st.CAPTURING, states=st.CAPTURE_STATES,
    process_states=st.CAPTURE_PROCESS_STATES, report=CaptureReport, recorded="recorded",
    grace_error=("did not stop within the grace period: torch.profiler can only stop on the engine's "
                 "own step, and this process took no step (idle engine?)"),
    window_processes=True,
)
SCAN = JobKind(
    name="scan", id_prefix="s", running=st.SCANNING, states=st.SCAN_STATES,
    process_states=st.SCAN_PROCESS_STATES, report=SyncReport, recorded="scanned",
    grace_error="did not stop within the grace period (idle engine?)",
)
# Module timing (modules.py): hooks on every nn.Module of the model for N steps.
MODULES = JobKind(
    name="module timing", id_prefix="m", running=st.TIMING, states=st.MODULE_STATES,
    process_states=st.MODULE_PROCESS_STATES, report=ModuleReport, recorded="timed",
    grace_error="did not stop within the grace period: the hooks come out on the engine's own step (idle engine?)",
)


# A memory snapshot (memory.py): the CUDA caching allocator's history for N steps, in the processes with CUDA.
MEMORY = JobKind(
    name="memory snapshot", id_prefix="g", running=st.RECORDING, states=st.MEMORY_STATES,
    process_states=st.MEMORY_PROCESS_STATES, report=MemoryReport, recorded="recorded",
    grace_error=("did not stop within the grace period: the snapshot is taken on the engine's own step "
                 "(idle engine?)"),
)


class JobBusy(Exception):
    """A job of any kind is running: one at a time (a profiler would record a scan's overhead)."""

    def __init__(self, active: "Job") -> None:
        super().__init__(f"{active.kind.name} {active.id} is {active.state}")
        self.active = active


class NoProbes(Exception):
    pass


_STEP_DRIVEN = {r.name: r.step_driven for r in STANDARD_ROLES}
# The fields of a process's JSON that are its identity's: read back together by ``identity_from_json``.
IDENTITY_FIELDS = frozenset({"role", "pid", "rank", "label", "instance"})


def identity_from_json(p: dict[str, Any]) -> ProcessIdentity:
    """A process's identity from its saved JSON (role, pid, rank, label). The saved label is
    ``<role label>[ rank k] (pid n)``, so the role label is what precedes that suffix. Whether the
    role is step-driven is not saved: a standard role's own, else step-driven (only the order of a
    listing depends on it once a job has ended)."""
    role, pid, rank = str(p.get("role") or "unknown"), int(p.get("pid") or 1), p.get("rank")
    label = str(p.get("label") or role)
    suffix = (f" rank {rank}" if rank is not None else "") + f" (pid {pid})"
    role_label = label[: -len(suffix)] if label.endswith(suffix) and len(label) > len(suffix) else role
    return ProcessIdentity(role=role, role_label=role_label, step_driven=_STEP_DRIVEN.get(role, True),
                           pid=max(1, pid), rank=rank if isinstance(rank, int) else None,
                           instance=str(p.get("instance") or ""))


def _count(value: Any) -> int:
    return int(value or 0)


def _as_saved(value: Any) -> Any:
    return value


@dataclass(eq=False, kw_only=True)
class ProcessRun:
    """One engine process's part in a job. ``state`` moves through the kind's process table.

    Its JSON (in the job's: ``GET`` of the job, its saved file) is ``json_fields``, in that order, each
    kind naming its own; a saved job's processes come back by ``from_json``, each field read by
    ``json_readers`` (as saved where it names none)."""

    json_fields: ClassVar[tuple[str, ...]]
    json_readers: ClassVar[dict[str, Callable[[Any], Any]]] = {"state": str, "steps_recorded": _count}

    conn: "ProbeConnection | None"
    identity: ProcessIdentity
    state: str = P_ARMED
    steps_recorded: int = 0
    steps_seen: int | None = None  # the process's working-step count when it was armed
    step_rate: float | None = None  # its working steps per second lately, as it said when armed
    first_step: int | None = None  # the working step it started recording at
    start_step: int | None = None  # the step "begin" told it to start at (its instance's)
    arm_round_trip_s: float | None = None  # from sending "arm" to its "armed" reply (the begin lead)
    lead_s: float | None = None  # how far ahead in time its start step was chosen (None: no lead)
    error: str | None = None
    stop_reason: str | None = None  # why the probe ended early, as it reported (its own limit, say)

    # The identity's fields, by the names the merge and the JSON use.
    @property
    def label(self) -> str:
        return self.identity.label

    @property
    def role(self) -> str:
        return self.identity.role

    @property
    def pid(self) -> int:
        return self.identity.pid

    @property
    def rank(self) -> int | None:
        return self.identity.rank

    @property
    def instance(self) -> str:
        return self.identity.instance

    @property
    def stem(self) -> str:
        return self.identity.file_stem

    @property
    def step_driven(self) -> bool:
        return self.identity.step_driven

    @property
    def sort_key(self) -> tuple:
        return self.identity.sort_key

    @property
    def ended(self) -> bool:
        return self.state in st.P_TERMINAL

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.json_fields}

    @classmethod
    def from_json(cls, p: dict[str, Any], **given: Any) -> Self:
        """A process of a saved job, as ``to_json`` wrote it (no connection: it has ended), but the
        fields ``given``, which its kind decides itself."""
        fields = {name: cls.json_readers.get(name, _as_saved)(p.get(name))
                  for name in cls.json_fields if name not in IDENTITY_FIELDS and name not in given}
        return cls(conn=None, identity=identity_from_json(p), **fields, **given)


@dataclass(eq=False, kw_only=True)
class Job:
    kind: ClassVar[JobKind]

    id: str
    request: Any  # a params.JobRequest: steps, delay, processes, timeout_s
    processes: list[Any]  # ProcessRun of the kind
    state: str = st.ARMED
    reason: str | None = None
    stop_reason: str | None = None
    stopped_by_user: bool = False  # its user's stop request came first (not the timeout's)
    created_at: float = field(default_factory=time.time)
    armed_at: float = field(default_factory=time.monotonic)  # when "arm" was sent (reset at sending)
    finished_at: float | None = None
    start_step: int | None = None  # the common first working step sent in "begin" (None: several instances)
    start_steps: dict[str, int] = field(default_factory=dict)  # each engine instance's ("": unnamed)
    notes: list[str] = field(default_factory=list)
    # Its upload to the object store (``sidecar serve --store``): {url, state, error}; None without a store
    # (jobs/storing.py).
    stored: dict[str, Any] | None = None
    armed_event: asyncio.Event = field(default_factory=asyncio.Event)  # every step-driven process answered
    done_event: asyncio.Event = field(default_factory=asyncio.Event)  # final state reached

    def advance(self, new: str) -> None:
        st.require(self.kind.states, self.state, new, f"{self.kind.name} {self.id}")
        self.state = new

    def can_move(self, rec: ProcessRun, new: str) -> bool:
        return st.allowed(self.kind.process_states, rec.state, new)

    def move(self, rec: ProcessRun, new: str, error: str | None = None) -> None:
        st.require(self.kind.process_states, rec.state, new, f"{self.kind.name} {self.id}, {rec.label}")
        rec.state = new
        if error is not None:
            rec.error = error

    @property
    def step_driven(self) -> list[Any]:
        return [p for p in self.processes if p.step_driven]

    def all_ended(self, processes: list[Any] | None = None) -> bool:
        return all(p.ended for p in (self.processes if processes is None else processes))


CANCELLED_REASON = "cancelled by the user before any step was recorded"


def cancelled(job: Job) -> bool:
    """Whether a job whose processes have all ended is ``cancelled`` rather than judged: its user
    stopped it while it was armed, and no step-driven process began recording since (the job would
    have moved on to capturing / scanning). Asked before the kind moves the job on."""
    return job.stopped_by_user and job.state == st.ARMED


def verdict(job: Job, problems: list[str], *, has_result: bool) -> tuple[str, str | None]:
    """The final state and reason: ``failed`` without a result (no engine step), else ``partial``
    when anything is missing (an early stop, a process not done, a shortfall of steps, a problem of
    the kind's own), else ``done``."""
    reasons = ([job.stop_reason] if job.stop_reason else []) + list(problems)
    for rec in job.processes:
        if rec.state != P_DONE:
            reasons.append(f"{rec.label}: {rec.error or rec.state}")
        elif rec.step_driven and rec.steps_recorded < job.request.steps:
            why = f" ({rec.stop_reason})" if rec.stop_reason and rec.stop_reason != job.stop_reason else ""
            reasons.append(f"{rec.label}: {job.kind.recorded} {rec.steps_recorded} of {job.request.steps} steps{why}")
    reason = "; ".join(dict.fromkeys(reasons)) or None
    if not has_result:
        return st.FAILED, reason or "no engine step was recorded"
    return (st.PARTIAL, reason) if reason else (st.DONE, None)
