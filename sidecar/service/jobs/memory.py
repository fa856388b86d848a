"""Memory snapshots: the CUDA caching allocator's history over N working steps, in every selected worker.

The fourth kind of job (model.py ``MEMORY``), on the shared life cycle (manager.py): armed in every
selected step-driven process that has CUDA and whose probe knows the job
(``ProcessIdentity.extra["memory_snapshot"]``), begun at one start step, ended after N working steps.
Each process summarises its own snapshot (sidecar/probe/memory_job.py, memory_summary.py) and reports
the summary with the path of its raw snapshot, a pickle for PyTorch's viewer that the sidecar never
opens: it only copies the bytes (or fetches them over the channel, from a probe on another host) into
``<trace-dir>/memory/<id>/<process stem>.pickle``, at most ``max_bytes`` each. The job's JSON is
saved as ``<trace-dir>/memory/<id>.json``, so that it is listed and served after a restart, as module
timings are; retention removes both.

Where no selected process has CUDA the start is refused (``NoCuda``, a 400 naming why).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from ...common.protocol import (DEFAULT_MEMORY_ENTRIES, DEFAULT_MEMORY_FILE_BYTES, MEMORY_EXTRA, P_DONE,
                                MemoryArm, MemoryReport, MemorySpec)
from ..channel import file_fetch
from ..channel.registry import ProbeRegistry
from ..export import disk_space
from ..export.process_stems import WRITTEN_STEM, unique_stems
from .arming import ARM_REPLY_S
from .board import JobBoard
from .manager import STOP_GRACE_S, JobManager
from .model import MEMORY, Job, JobKind, ProcessRun
from .params import MemoryRequest, ParamError
from .saved import SavedAsOneFile, id_time
from .storing import JobStore, read_stored

log = logging.getLogger(__name__)

RAW_SUFFIX = ".pickle"  # <trace-dir>/memory/<id>/<stem>.pickle
PROBE_SUFFIX = ".memory.pickle"  # what a probe writes (memory_job.SUFFIX), under <its root>/captures/<id>/raw/


class NoCuda(ParamError):
    """No selected process has a CUDA caching allocator to record: a 400 that says so."""

    def to_json(self) -> dict:
        return {"error": "no_cuda", "param": self.param, "message": self.message}


def is_raw_name(name: object) -> bool:
    """A raw snapshot's name in a job's folder, as this module writes it (a restored JSON is not trusted)."""
    return (isinstance(name, str) and name.endswith(RAW_SUFFIX)
            and WRITTEN_STEM.fullmatch(name[: -len(RAW_SUFFIX)]) is not None)


@dataclass(eq=False, kw_only=True)
class MemoryProcess(ProcessRun):
    json_fields = ("role", "pid", "rank", "label", "state", "steps_recorded", "first_step", "error", "stop_reason",
                   "entries", "bytes", "file", "summary")

    raw_stem: str = ""  # its raw snapshot's name in the job's folder, less the suffix (unique in the job)
    entries: int = 0  # alloc/free events in its history
    bytes: int = 0  # its raw snapshot's size, once here
    file: str | None = None  # its raw snapshot's name in the job's folder (None: not kept)
    summary: dict[str, Any] | None = None  # the probe's, with "done"
    remote_file: str | None = None  # the path its probe reported (never served)


def _peak(processes: list[MemoryProcess]) -> dict[str, Any] | None:
    """The highest peak of allocated memory among the processes, and whose."""
    best = None
    for rec in processes:
        peak = (rec.summary or {}).get("peak") or {}
        if isinstance(peak.get("allocated_bytes"), int) and (best is None or peak["allocated_bytes"] > best[1]):
            best = (rec, peak["allocated_bytes"], peak.get("reserved_bytes"))
    if best is None:
        return None
    return {"process": best[0].label, "allocated_bytes": best[1], "reserved_bytes": best[2]}


@dataclass(eq=False, kw_only=True)
class MemoryJob(Job):
    kind: ClassVar[JobKind] = MEMORY

    request: MemoryRequest
    processes: list[MemoryProcess]
    fetches: list[asyncio.Future] = field(default_factory=list)  # raw snapshots being brought here

    def url(self) -> str:
        return f"/memory/{self.id}"

    def to_json(self) -> dict[str, Any]:
        """``GET /memory/{id}`` and the saved file (docs/api.md, "Memory snapshot")."""
        processes = []
        for p in self.processes:
            row = p.to_json()
            row["download"] = f"{self.url()}/files/{p.file}" if p.file else None
            processes.append(row)
        return {
            "id": self.id, "state": self.state, "reason": self.reason, "steps": self.request.steps,
            "max_entries": self.request.max_entries, "delay": self.request.delay,
            "created_at": self.created_at, "finished_at": self.finished_at, "start_step": self.start_step,
            "notes": self.notes, "peak": _peak(self.processes), "page": f"{self.url()}/page",
            "processes": processes, "stored": self.stored,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "MemoryJob":
        """A result saved by ``to_json`` (an earlier run of the sidecar), as a finished job."""
        processes = []
        for p in data.get("processes") or []:
            name = p.get("file")
            summary = p.get("summary")
            processes.append(MemoryProcess.from_json(
                p, file=name if is_raw_name(name) else None, raw_stem=name[: -len(RAW_SUFFIX)] if is_raw_name(name) else "",
                summary=summary if isinstance(summary, dict) else None,
                entries=int(p.get("entries") or 0), bytes=int(p.get("bytes") or 0)))
        job = cls(
            id=data["id"], state=data["state"], reason=data.get("reason"),
            request=MemoryRequest(steps=int(data.get("steps") or 1), delay=int(data.get("delay") or 0),
                                  max_entries=int(data.get("max_entries") or DEFAULT_MEMORY_ENTRIES)),
            processes=processes,
            created_at=float(data.get("created_at") or id_time(MEMORY, data["id"]) or 0.0),
            finished_at=data.get("finished_at"), start_step=data.get("start_step"),
            notes=list(data.get("notes") or []),
        )
        job.stored = read_stored(data.get("stored"))
        job.done_event.set()
        return job


def _probe_file(reported: str, job_id: str) -> Path | None:
    """The raw snapshot a probe on this host reported, resolved, if it has the job's own shape of path
    (``<its root>/captures/<id>/raw/<stem>.memory.pickle``); None for any other path: never read."""
    path = Path(reported).resolve()
    if not path.name.endswith(PROBE_SUFFIX) or path.parent.name != "raw" or path.parent.parent.name != job_id:
        return None
    return path if path.is_file() else None


def _take_local(source: Path, target: Path, max_bytes: int) -> int:
    """Copy a probe's raw snapshot into the job's folder (at most ``max_bytes``), then delete it and the
    probe's ``raw/`` and ``<id>/`` folders once empty. Raises OSError or ValueError."""
    try:
        size = source.stat().st_size
        if size > max_bytes:
            raise ValueError(f"{size} bytes: over the limit of {max_bytes / 2**20:g} MiB")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        return size
    finally:
        source.unlink(missing_ok=True)
        for folder in (source.parent, source.parent.parent):
            try:
                folder.rmdir()
            except OSError:
                break


class MemoryManager(SavedAsOneFile, JobManager[MemoryJob]):
    kind = MEMORY
    saved_noun = "memory snapshot"
    store_kind, store_folder = "memory", "memory"
    job_from_json = MemoryJob.from_json

    def __init__(self, registry: ProbeRegistry, board: JobBoard, store_dir: Path, *, keep: int,
                 keep_bytes: int | None = None, max_bytes: int = DEFAULT_MEMORY_FILE_BYTES,
                 stop_grace_s: float = STOP_GRACE_S, arm_reply_s: float = ARM_REPLY_S,
                 on_finished: Callable[[MemoryJob], None] | None = None, store: JobStore | None = None) -> None:
        """``max_bytes``: the bound on each process's raw snapshot (the probes hold to it too)."""
        super().__init__(registry, board, keep=keep, keep_bytes=keep_bytes, stop_grace_s=stop_grace_s,
                         arm_reply_s=arm_reply_s, on_finished=on_finished, store=store)
        self._dir = store_dir
        self.max_bytes = max_bytes
        self._adopt(self._restore())
        self._clear_orphans()

    def folder(self, job: MemoryJob) -> Path:
        return self._dir / job.id

    # -- the kind's own -----------------------------------------------------------------------------
    def _create(self, request: MemoryRequest) -> MemoryJob:
        chosen = self._select(request)
        with_cuda = [c for c in chosen if c.identity.cuda and c.identity.extra.get(MEMORY_EXTRA)]
        if not with_cuda:
            have = ", ".join(f"{c.identity.label}: {'CUDA' if c.identity.cuda else 'no CUDA'}" for c in chosen)
            why = "no selected process has CUDA" if not any(c.identity.cuda for c in chosen) else (
                "no selected process with CUDA has a probe that knows memory snapshots (an older probe?)")
            raise NoCuda("processes", f"{why}: a memory snapshot reads the CUDA caching allocator's history, "
                                      f"which only a process with CUDA has ({have})")
        stems = unique_stems([(c.identity, c.shares_files) for c in with_cuda])
        return MemoryJob(id=self.kind.new_id(), request=request,
                         processes=[MemoryProcess(conn=c, identity=c.identity, raw_stem=stem)
                                    for c, stem in zip(with_cuda, stems)])

    def _arm_message(self, job: MemoryJob) -> MemoryArm:
        return MemoryArm(spec=MemorySpec(id=job.id, steps=job.request.steps, max_entries=job.request.max_entries,
                                         max_bytes=self.max_bytes))

    def _take_result(self, job: MemoryJob, rec: MemoryProcess, report: MemoryReport) -> None:
        rec.summary, rec.entries = report.summary, report.entries
        if report.graph_steps:  # said, not left as zeros: sidecar/common/cuda_graphs.py
            job.notes.append(f"{rec.label}: {report.graph_steps} of {report.steps_recorded} steps replayed a CUDA graph "
                             f"({report.graph_replays} replays): a replay allocates nothing through the caching "
                             "allocator (the graph's memory pool was taken when it was captured), so those steps' "
                             "allocations are not in the history")
        if report.file and rec.conn is not None:
            rec.remote_file = report.file
            # Brought here now, while the process is surely there, not when every process is done.
            job.fetches.append(asyncio.ensure_future(self._bring(job, rec)))

    async def _bring(self, job: MemoryJob, rec: MemoryProcess) -> None:
        """The process's raw snapshot into the job's folder: read where it lies (a shared disk) or
        fetched over the channel; one that does not arrive is a note, the summary stays."""
        target = self.folder(job) / f"{rec.raw_stem}{RAW_SUFFIX}"
        try:
            if rec.conn.shares_files:
                source = _probe_file(rec.remote_file, job.id)
                if source is None:
                    raise ValueError(f"{rec.remote_file!r} is not a memory snapshot of this job")
                size = await asyncio.get_running_loop().run_in_executor(None, _take_local, source, target,
                                                                        self.max_bytes)
            else:
                size = await file_fetch.fetch_file(rec.conn, rec.remote_file, target, self.max_bytes)
        except (file_fetch.FetchError, OSError, ValueError) as exc:
            disk_space.unlink_quietly(target)
            why = disk_space.describe(exc) if isinstance(exc, OSError) else str(exc)
            log.warning("memory snapshot %s: %s: raw snapshot not received: %s", job.id, rec.label, why)
            job.notes.append(f"{rec.label}: raw snapshot not kept: {why} (its summary is)")
            return
        rec.file, rec.bytes = target.name, size

    async def _finish(self, job: MemoryJob) -> None:
        # On a task of its own: a fetch's chunks arrive on the channel whose report got here.
        self._spawn(self._conclude_when_here(job))

    async def _conclude_when_here(self, job: MemoryJob) -> None:
        if job.fetches:
            await asyncio.gather(*job.fetches, return_exceptions=True)
        job.fetches.clear()
        for rec in job.processes:
            raw = (rec.summary or {}).get("raw_file") or {}
            if rec.state == P_DONE and raw.get("note"):
                job.notes.append(f"{rec.label}: {raw['note']}")
            if rec.state == P_DONE and (rec.summary or {}).get("truncated"):
                job.notes.append(f"{rec.label}: the history held {job.request.max_entries} entries, its limit: "
                                 "the earliest were dropped (raise max_entries or ask for fewer steps)")
        done = [p for p in job.processes if p.state == P_DONE and p.summary is not None]
        self._conclude(job, [], has_result=bool(done))

    async def _cancel(self, job: MemoryJob) -> None:
        self._remove(job)
        await super()._cancel(job)

    def _upload(self, job: MemoryJob) -> None:
        """Not uploaded to the object store: a raw snapshot is a pickle for a person's viewer, and the
        summary alone would be half the job (docs/api.md, "Memory snapshot")."""
        return None

    # -- the disk ----------------------------------------------------------------------------------
    def _remove(self, job: MemoryJob) -> None:
        super()._remove(job)
        shutil.rmtree(self.folder(job), ignore_errors=True)

    def _footprint(self, job: MemoryJob) -> int:
        return super()._footprint(job) + disk_space.tree_bytes(self.folder(job))

    def _clear_orphans(self) -> None:
        """Folders of snapshots whose job is not listed (a sidecar stopped before it saved the job):
        deleted, as retention would."""
        try:
            entries = list(self._dir.iterdir())
        except OSError:
            return
        for path in entries:
            if path.is_dir() and not path.is_symlink() and self.kind.is_id(path.name) and self.get(path.name) is None:
                shutil.rmtree(path, ignore_errors=True)

    def raw_path(self, job: MemoryJob, name: str) -> Path | None:
        """The raw snapshot ``name`` of ``job``, if the job has one by that name (never another path)."""
        if not any(p.file == name for p in job.processes) or not is_raw_name(name):
            return None
        return self.folder(job) / name

