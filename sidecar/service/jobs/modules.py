"""Module timing: every ``nn.Module`` of the model timed for N working steps, answered as one table.

The third kind of job (model.py ``MODULES``), on the shared life cycle (manager.py): armed in every
selected process whose probe knows its model (``ProcessIdentity.extra["model"]``, set by the engine
integration), begun at one start step, ended after N working steps. Each process reports one row per
module (sidecar/probe/modules_job.py); what is this kind's own: merging those rows by module path
(the ranks of a tensor-parallel model share their paths) and by module class, each with its share of
the forward, and saving the result as ``<trace-dir>/modules/<id>.json`` so that it is listed and
served after a restart, as scans are.

``forward_ms`` is the time in the outermost timed calls (the model's forward, and modules an engine
calls outside it, such as a logits processor); ``share`` is a module's total time over it (nested
modules overlap: the model itself is 1.0), ``self_share`` its self time over it (these add up to 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from ...common.protocol import MODEL_EXTRA, ModuleArm, ModuleReport, ModuleSpec
from .arming import ARM_REPLY_S
from .board import JobBoard
from .manager import STOP_GRACE_S, JobManager
from .model import MODULES, Job, JobKind, NoProbes, ProcessRun
from .params import JobRequest, ParamError
from ..channel.registry import ProbeRegistry
from .storing import JobStore, read_stored
from .saved import SavedAsOneFile, id_time


@dataclass(eq=False, kw_only=True)
class ModuleProcess(ProcessRun):
    json_fields = ("role", "pid", "rank", "label", "state", "steps_recorded", "first_step", "error",
                   "clock", "hooks_before", "hooks_after")

    clock: str | None = None  # "cuda" (device events) or "cpu" (the host clock), with "done"
    rows: list[dict[str, Any]] | None = None  # with "done": one per module that ran
    hooks_before: int | None = None
    hooks_after: int | None = None


def _ms(ns: int | float) -> float:
    return round(ns / 1e6, 6)


def _share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole > 0 else 0.0


def merge_rows(processes: list[ModuleProcess], steps: int) -> dict[str, Any]:
    """The processes' rows as the job's tables: by module path and by module class."""
    by_path: dict[str, dict[str, Any]] = {}
    by_type: dict[str, dict[str, Any]] = {}
    forward_ns = 0
    for rec in processes:
        if rec.rows is None:
            continue
        for r in rec.rows:
            forward_ns += r["outer_ns"]  # calls with no timed module around them: counted once
            for table, key in ((by_path, r["path"]), (by_type, r["type"])):
                row = table.setdefault(key, {"type": r["type"], "calls": 0, "total_ns": 0, "self_ns": 0})
                row["calls"] += r["calls"]
                row["total_ns"] += r["total_ns"]
                row["self_ns"] += r["self_ns"]

    def out(key_name: str, key: str, row: dict[str, Any]) -> dict[str, Any]:
        shown = {key_name: key} if key_name == "type" else {key_name: key, "type": row["type"]}
        return {**shown, "calls": row["calls"], "total_ms": _ms(row["total_ns"]), "self_ms": _ms(row["self_ns"]),
                "mean_ms": _ms(row["total_ns"] / row["calls"]) if row["calls"] else 0.0,
                "share": _share(row["total_ns"], forward_ns), "self_share": _share(row["self_ns"], forward_ns)}

    modules = sorted(by_path.items(), key=lambda kv: (-kv[1]["total_ns"], kv[0]))
    types = sorted(by_type.items(), key=lambda kv: (-kv[1]["self_ns"], kv[0]))
    return {
        "forward_ms": _ms(forward_ns),
        "forward_ms_per_step": _ms(forward_ns / steps) if steps else 0.0,
        "modules": [out("path", k, v) for k, v in modules],
        "types": [out("type", k, v) for k, v in types],
    }


@dataclass(eq=False, kw_only=True)
class ModuleJob(Job):
    kind: ClassVar[JobKind] = MODULES

    request: JobRequest
    processes: list[ModuleProcess]
    tables: dict[str, Any] = field(default_factory=dict)  # merge_rows's, once every process has ended

    def to_json(self) -> dict[str, Any]:
        """``GET /modules/{id}`` and the saved file (docs/api.md, "Module timing")."""
        clocks = sorted({p.clock for p in self.processes if p.clock})
        hooks = [p.hooks_after - p.hooks_before for p in self.processes
                 if p.hooks_after is not None and p.hooks_before is not None]
        return {
            "id": self.id, "state": self.state, "reason": self.reason, "steps": self.request.steps,
            "delay": self.request.delay, "created_at": self.created_at, "finished_at": self.finished_at,
            "start_step": self.start_step, "notes": self.notes,
            "clock": "+".join(clocks) or None,
            "hooks_left": sum(hooks) if hooks else None,
            "forward_ms": self.tables.get("forward_ms"),
            "forward_ms_per_step": self.tables.get("forward_ms_per_step"),
            "modules": self.tables.get("modules", []),
            "types": self.tables.get("types", []),
            "processes": [p.to_json() for p in self.processes],
            "stored": self.stored,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ModuleJob":
        """A result saved by ``to_json`` (an earlier run of the sidecar), as a finished job."""
        job = cls(
            id=data["id"], state=data["state"], reason=data.get("reason"),
            request=JobRequest(steps=int(data.get("steps") or 1), delay=int(data.get("delay") or 0)),
            processes=[ModuleProcess.from_json(p) for p in data.get("processes") or []],
            tables={k: data.get(k) for k in ("forward_ms", "forward_ms_per_step", "modules", "types")},
            created_at=float(data.get("created_at") or id_time(MODULES, data["id"]) or 0.0),
            finished_at=data.get("finished_at"), start_step=data.get("start_step"),
            notes=list(data.get("notes") or []),
        )
        job.stored = read_stored(data.get("stored"))
        job.done_event.set()
        return job


class ModuleManager(SavedAsOneFile, JobManager[ModuleJob]):
    kind = MODULES
    saved_noun = "module timing"
    store_kind, store_folder = "modules", "modules"
    job_from_json = ModuleJob.from_json

    def __init__(self, registry: ProbeRegistry, board: JobBoard, store_dir: Path, *, keep: int,
                 keep_bytes: int | None = None, stop_grace_s: float = STOP_GRACE_S, arm_reply_s: float = ARM_REPLY_S,
                 on_finished: Callable[[ModuleJob], None] | None = None, store: JobStore | None = None) -> None:
        super().__init__(registry, board, keep=keep, keep_bytes=keep_bytes, stop_grace_s=stop_grace_s,
                         arm_reply_s=arm_reply_s, on_finished=on_finished, store=store)
        self._dir = store_dir
        self._adopt(self._restore())

    def _create(self, request: JobRequest) -> ModuleJob:
        chosen = self._select(request)
        with_model = [c for c in chosen if c.identity.extra.get(MODEL_EXTRA)]
        if not with_model:
            if not any(c.identity.extra.get(MODEL_EXTRA) for c in self._registry.all()):
                raise NoProbes("no connected engine process has told its probe where its model is")
            have = ", ".join(c.identity.label for c in self._registry.all() if c.identity.extra.get(MODEL_EXTRA))
            raise ParamError("processes", f"selects no process that runs the model (those that do: {have})")
        return ModuleJob(id=self.kind.new_id(), request=request,
                         processes=[ModuleProcess(conn=c, identity=c.identity) for c in with_model])

    def _arm_message(self, job: ModuleJob) -> ModuleArm:
        return ModuleArm(spec=ModuleSpec(id=job.id, steps=job.request.steps))

    def _take_result(self, job: ModuleJob, rec: ModuleProcess, report: ModuleReport) -> None:
        rec.rows = [{"path": r.path, "type": r.type, "calls": r.calls, "total_ns": r.total_ns, "self_ns": r.self_ns,
                     "outer_ns": r.outer_ns} for r in report.rows or []]
        rec.clock = report.clock
        rec.hooks_before, rec.hooks_after = report.hooks_before, report.hooks_after
        if report.graph_steps:  # said, not left as zeros: sidecar/common/cuda_graphs.py
            job.notes.append(f"{rec.label}: {report.graph_steps} of {report.steps_recorded} steps replayed a CUDA graph "
                             f"({report.graph_replays} replays): module hooks do not run inside a replay; "
                             "the modules' times in those steps are missing")

    async def _finish(self, job: ModuleJob) -> None:
        done = [p for p in job.processes if p.rows is not None]
        job.tables = merge_rows(done, job.request.steps)
        problems = [f"{p.label}: {p.hooks_after - p.hooks_before} hook(s) left on the model"
                    for p in done if p.hooks_after is not None and p.hooks_after != p.hooks_before]
        self._conclude(job, problems, has_result=bool(done))

