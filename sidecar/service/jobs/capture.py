"""A capture as the sidecar keeps it: the job, its processes, its request bound or not, its URL, its
JSON (``GET /profile/{id}`` and capture.json: ``Capture.to_json``).

The manager that runs captures is captures.py; what a restart reads back is capture_index.py (both
build on this module, neither on the other's internals).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ...common.protocol import CaptureSpec
from .model import CAPTURE, Job, JobKind, ProcessRun
from .params import CaptureRequest


# Where an nsys capture's result is: not with the sidecar (docs/gpu.md).
NSYS_REPORT = ("written by nsys where its -o said (nsys launch / nsys start), on the engine's host, "
               "once the engine's nsys session ends; the sidecar holds no trace of it")


def capture_url(capture_id: str) -> str:
    """Where the HTTP API serves a capture (``GET /profile/{id}``; its trace at ``…/trace``)."""
    return f"/profile/{capture_id}"


@dataclass(frozen=True)
class BoundCaptureRequest(CaptureRequest):
    """A capture of one request's steps: ``steps`` is the cap (request_captures.py)."""

    request_id: str = ""
    asked_by: str = ""  # the process that asked (the API server's label)


@dataclass(eq=False, kw_only=True)
class CaptureProcess(ProcessRun):
    json_fields = ("role", "pid", "rank", "label", "instance", "state", "steps_recorded", "first_step",
                   "file", "bytes", "error", "stacks", "stack_summary", "step_thread_ms", "export_ms", "clock",
                   "nsys")
    json_readers = {**ProcessRun.json_readers, "file": lambda v: v or None, "bytes": lambda v: int(v or 0),
                    "stacks": lambda v: str(v or "none"), "step_thread_ms": lambda v: float(v or 0.0)}

    raw_file: str | None = None  # the probe's plain JSON in <its trace root>/captures/<id>/raw/, until the export
    file: str | None = None  # the compressed per-process trace, after it
    bytes: int = 0
    stacks: str = "none"  # the Python stacks this process recorded: none, sampled or traced
    stacks_file: str | None = None  # sampled stacks: the probe's raw samples beside raw_file, until the export
    stack_summary: dict[str, Any] | None = None  # sampled stacks: their summary, built at the export
    step_thread_ms: float = 0.0  # the profiler's calls on the engine's step thread, as the probe measured
    export_ms: float | None = None  # writing its trace file, on the probe's export thread
    # Its clock against the sidecar's when it reported done (clock_sync.py ``to_json``), and what the
    # merge subtracts from its times: the offset where measurably off (another host), else 0.
    clock: dict[str, Any] | None = None
    clock_correction_ns: int = 0
    nsys: dict[str, Any] | None = None  # an nsys capture: what the probe reported (CaptureReport.nsys)
    # Its stem in this capture's files, where its own is taken by a process of another host (process_stems.py).
    unique_stem: str | None = None

    @property
    def stem(self) -> str:
        return self.unique_stem or self.identity.file_stem


@dataclass(eq=False, kw_only=True)
class Capture(Job):
    kind: ClassVar[JobKind] = CAPTURE

    request: CaptureRequest
    processes: list[CaptureProcess]
    dir: Path
    trace_file: str | None = None
    trace_bytes: int = 0
    headline: str | None = None
    summary_file: str | None = None
    window_stop_sent: bool = False
    trigger: dict[str, Any] | None = None  # the trigger firing that started it (triggers.py); None: a user did
    alert: dict[str, Any] | None = None  # the Alertmanager alert that started it (alerts.py); None: none did
    # The request it is bound to: {"id", "max_steps", "asked_by"} (request_captures.py); None: not bound.
    bound_request: dict[str, Any] | None = None
    # Files being fetched from processes that do not share the sidecar's disk (file_fetch.py): the
    # export waits for them.
    fetches: list[asyncio.Task] = field(default_factory=list, repr=False)
    # Its folder in the object store (``captures/<id>/`` or ``fleets/<fleet>/<instance>/<id>/``,
    # store/layout.py), once uploaded or listed from there; None: not in a store.
    store_prefix: str | None = None

    def spec(self) -> CaptureSpec:
        r = self.request
        return CaptureSpec(
            id=self.id, steps=r.steps, activities=r.activities,
            record_shapes=r.record_shapes, stacks=r.stacks, stack_hz=r.stack_hz,
            profile_memory=r.profile_memory, with_flops=r.with_flops, with_modules=r.with_modules,
            request_id=self.bound_request["id"] if self.bound_request else None, backend=r.backend,
        )

    def files(self) -> list[str]:
        """Names of the files a client may download, in the capture's directory."""
        names = [p.file for p in self.processes if p.file]
        return names + ([self.trace_file] if self.trace_file else [])

    def to_json(self) -> dict[str, Any]:
        """``GET /profile/{id}``, also saved as the capture's capture.json: the same object, with its
        download URLs (docs/api.md)."""
        url, r = capture_url(self.id), self.request
        return {
            "id": self.id,
            "state": self.state,
            "reason": self.reason,
            "notes": self.notes,
            "steps": r.steps,
            "start_step": self.start_step,
            "start_steps": self.start_steps,
            "delay": r.delay,
            "created_at": self.created_at,
            "finished_at": self.finished_at,
            "headline": self.headline,
            "trace": f"{url}/trace" if self.trace_file else None,
            "trace_bytes": self.trace_bytes,
            "summary": f"{url}/summary" if self.summary_file else None,
            "processes": [p.to_json() for p in self.processes],
            "trigger": self.trigger,
            "alert": self.alert,
            "request": self.bound_request,
            "fleet": r.fleet,
            "backend": r.backend,
            "nsys": {"report": NSYS_REPORT} if r.backend == "nsys" else None,
            "stored": self.stored,
            "files": {name: f"{url}/files/{name}" for name in self.files()},
            "options": {
                "activities": list(r.activities) or "host default",
                "record_shapes": r.record_shapes, "with_stack": r.with_stack,
                "stacks": r.stacks, "stack_hz": r.stack_hz if r.with_stack else None,
                "profile_memory": r.profile_memory, "with_flops": r.with_flops, "with_modules": r.with_modules,
                "timeout_s": r.timeout_s,
                "processes": [f"{s.role}:{s.rank}" if s.rank is not None else s.role for s in r.processes] or "all",
                "instance": r.instance,
                "backend": r.backend,
            },
        }
