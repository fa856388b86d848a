"""The probe: one per engine process, called by the engine integration on every step.

Engine integrations (``plugins/sidecar_vllm``, ...) build it with their ``EngineProfile`` and a role
of that profile, and call ``step_begin(has_work)`` before and ``step_end(did_work)`` after each
engine step. While no job is armed each call is an attribute read and a comparison; the link thread
puts a job (a ``StepCapture``, a ``SyncScan``) in its slot when the sidecar arms one, and the job's
window (sidecar/common/step_window.py) decides what each step does.

Messages reach it only from a sidecar that proved it knows the token (link.py). Even so the probe
keeps its own rules: it writes only under its trace root (capture/trace_root.py) and holds its own limits on
steps, duration and bytes (capture/limits.py), whatever a message asks.
"""

from __future__ import annotations

import importlib
import logging
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from threading import get_ident
from time import time_ns
from typing import Any, Callable

import msgspec

from ..common import config
from ..engine import GENERIC, EngineProfile
from ..common.protocol import (
    P_FAILED,
    Arm,
    Begin,
    CaptureReport,
    CaptureSpec,
    Fetch,
    FromSidecar,
    Hello,
    ProcessIdentity,
    Query,
    RequestCaptureAnswer,
    StepAlarm,
    Stop,
    SyncArm,
    SyncReport,
    SyncSpec,
    Verdict,
)
from ..common.protocol_codec import PROTOCOL_VERSION, decode_hello, encode
from ..common.packed_rows import PACKED_FORMAT
from ..stacks import threads as thread_stacks
from .flight_ring import GcPauses, RequestRing, StepRing, capacity_from_environment
from .gpu_memory import GpuMemory
from . import sync_tools
from .file_sender import FileSender
from .heartbeat import HeartbeatSource
from .capture.limits import ProbeLimits
from .link import SidecarLink
from .queries import QueryAnswerer
from .capture.profiler_options import stack_mode
from .capture.profiler import StepCapture, WindowCapture
from .capture.nsys import NsysCapture, TorchCudaCalls
from ..common.protocol import MODEL_EXTRA, ModuleArm, ModuleReport, ModuleSpec
from .modules_job import ModuleTiming
from ..common.protocol import MEMORY_EXTRA, MemoryArm, MemoryReport, MemorySpec
from .memory_job import SUFFIX as MEMORY_SUFFIX, Allocator, MemorySnapshot, TorchAllocator
from .request_capture import RequestCaptureAsks
from .capture.marker import MarkerName
from .capture.trace_root import TraceRoot
from .watchdog import Watchdog, threshold_from_environment
from ..common.step_window import clip

log = logging.getLogger(__name__)


def _make_marker(root: TraceRoot, host: str) -> str:
    """This probe's marker in its trace root; "" (its files will be fetched) when it cannot be made."""
    try:
        return root.make_marker(MarkerName.for_this_process(host))
    except (OSError, ValueError) as exc:
        log.warning("inference-sidecar: no marker in %s (%s): the sidecar will fetch this process's files",
                    root.path, exc)
        return ""


def _warm_profiler_imports() -> None:
    # torch.profiler's first start() imports torch._inductor (about 1 s, measured). Importing it here,
    # on the link thread at start-up, keeps that second off the step that begins the first capture.
    try:
        importlib.import_module("torch._inductor.config")
        importlib.import_module("torch.profiler")
    except Exception as exc:  # pragma: no cover - depends on the torch build
        log.debug("inference-sidecar: profiler warm-up import failed: %s", exc)


class Probe:
    def __init__(
        self,
        role: str,
        rank: int | None = None,
        *,
        profile: EngineProfile = GENERIC,
        endpoint: str | None = None,
        loop=None,
        cuda_available: bool | None = None,
        on_capture_report: Callable[[CaptureReport], None] | None = None,
        sync_watch: Any = None,
        trace_root: str | os.PathLike | None = None,
        limits: ProbeLimits | None = None,
        in_flight: Callable[[], list[dict]] | None = None,
        recorder_steps: int | None = None,
        watchdog_s: float | None = None,
        request_ring: bool | None = None,
        instance: str = "",
        model: Callable[[], Any] | None = None,
        phase_scopes: Callable[[bool], None] | None = None,
        memory_allocator: Allocator | None = None,
        cuda_calls: Any = None,
        gpu_memory: Any = None,
    ) -> None:
        """``role``: one of ``profile.roles`` (ValueError otherwise). ``loop``: the asyncio loop a
        process without steps records on (API server). ``on_capture_report``: also told of every
        report of this process's captures (a step-driven one's on the step thread or the export
        thread: keep it short), and of every capture's ``Verdict``. ``request_ring``: keep the flight
        recorder's ring of finished requests (default: in a process without steps, where requests
        arrive; a single-process engine serves them in its step-driven process and asks for it). ``sync_watch``: a ready ``SyncWatch`` instead of the one
        SIDECAR_SYNC_WATCH asks for. ``trace_root``, ``limits``: instead of SIDECAR_TRACE_DIR and the
        SIDECAR_PROBE_MAX_* variables. ``in_flight``: the requests this process knows in flight
        (``/requests``), called on the link thread. ``recorder_steps``, ``watchdog_s``: instead of
        SIDECAR_RECORDER_STEPS and SIDECAR_WATCHDOG_S. ``instance``: the engine instance this
        process belongs to (processes of one count the same steps), where several may share a sidecar.
        ``phase_scopes``: the engine's switch of this process's phase ranges (the profile's
        ``phase_ranges``), on while a capture records and off otherwise, called on the recording thread.
        ``memory_allocator``: the CUDA caching allocator the memory-snapshot job reads (memory_job.py;
        default: torch.cuda's where this process has CUDA), a stand-in in tests.
        ``cuda_calls``: what an nsys capture calls (capture/nsys.py ``CudaCalls``) instead of torch's
        CUDA profiler and NVTX functions: a test's recorder. ``gpu_memory``: the allocator's bytes for the
        step rows (gpu_memory.py ``GpuMemory``), instead of the one a step-driven process with CUDA makes."""
        if cuda_available is None:
            cuda_available = _cuda_available()
        self.profile = profile
        self.identity: ProcessIdentity = profile.identity(role, rank, cuda=cuda_available, instance=instance)
        # The sidecar refuses a hello it cannot decode and the link would retry it forever: check it
        # here, once, so a bad identity (a negative rank) fails the probe's start, loudly.
        if model is not None:  # the sidecar sends its module-timing jobs only where a model is
            self.identity = msgspec.structs.replace(self.identity, extra={**self.identity.extra, MODEL_EXTRA: True})
        # It knows the memory-snapshot job (the sidecar sends it only where this says so and CUDA is).
        self.identity = msgspec.structs.replace(self.identity, extra={**self.identity.extra, MEMORY_EXTRA: True})
        self._allocator = memory_allocator
        # A probe id of its own: its files' names carry it (``probe_file_stem``), unique on a shared disk.
        self.identity = msgspec.structs.replace(self.identity, probe_id=secrets.token_hex(4))
        decode_hello(encode(Hello(protocol=PROTOCOL_VERSION, process=self.identity, nonce="0" * 64)))
        self.trace_root = TraceRoot(trace_root if trace_root is not None else config.trace_dir())
        self.limits = limits if limits is not None else ProbeLimits.from_environment()
        self.steps = 0  # forward steps since start (steps with work)
        self._capture: StepCapture | None = None
        # The second slot: a sidecar.syncs.SyncScan while a hidden-sync scan runs, or a ModuleTiming
        # while a module-timing job does (one job at a time across kinds: they never meet here, and
        # the step path reads one slot for both).
        self._scan = None
        # ``model``: the engine integration's way to this process's model (a callable: engines build
        # their model after the object the probe is attached to), for the module-timing job.
        self._model = model
        self._loop = loop  # asyncio loop for window captures (API server)
        self._on_capture_report = on_capture_report  # also told of window captures (capture spans)
        # The always-on sync watch (sidecar.syncs.watch), step-driven processes only; None when off.
        if sync_watch is not None:
            self._watch, watch_note = sync_watch, None
        else:
            self._watch, watch_note = sync_tools.watch_from_environment(profile, self.identity.step_driven)
        if self._watch is not None:
            self._watch.install()
        self._exporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference-sidecar-export")
        # The flight recorder (sidecar/probe/flight_ring.py): always on, fixed memory. Steps in step-driven
        # processes; finished requests where the engine integration adds them (the API server).
        capacity = capacity_from_environment() if recorder_steps is None else recorder_steps
        self.gpu_memory = None
        if self.identity.step_driven and capacity > 0 and (gpu_memory is not None or cuda_available):
            try:  # the recorder without memory columns rather than no probe
                self.gpu_memory = (gpu_memory if gpu_memory is not None else GpuMemory()).start()
            except Exception as exc:
                log.warning("inference-sidecar: allocator bytes not recorded: %s", exc)
        self.ring: StepRing | None = (StepRing(capacity, self.gpu_memory)
                                      if self.identity.step_driven and capacity > 0 else None)
        wants_ring = not self.identity.step_driven if request_ring is None else request_ring
        self.request_ring: RequestRing | None = RequestRing() if wants_ring else None
        self.gc_pauses = GcPauses(step_thread_id=self._step_thread_id)
        self.gc_pauses.install()
        self._in_flight = in_flight
        self._phase_scopes = phase_scopes
        self._cuda_calls = cuda_calls
        threshold = threshold_from_environment() if watchdog_s is None else watchdog_s
        self.watchdog = None
        if threshold > 0 and self.ring is not None:
            ring = self.ring
            self.watchdog = Watchdog(threshold, lambda: ring.open_since_ns, lambda: self.steps + 1,
                                     lambda: thread_stacks.snapshot(ring.step_thread_id))
        self._heartbeats = HeartbeatSource(lambda: self.steps, watch=self._watch, watch_note=watch_note,
                                           ring=self.ring, watchdog=self.watchdog, in_flight=in_flight)
        # Files go over the channel where the sidecar does not see this marker (another host) or
        # where SIDECAR_PROBE_SEND_FILES asks (file_sender.py).
        self._marker = "" if config.env_flag(config.ENV_PROBE_SEND_FILES) else _make_marker(self.trace_root, self.identity.host)
        self._files = FileSender(self.trace_root)
        self._link = SidecarLink(
            endpoint or config.endpoint(),
            self.identity,
            on_message=self._on_message,
            on_disconnect=self._on_disconnect,
            heartbeat=self._heartbeats.build,
            warmup=_warm_profiler_imports,
            files_at=os.path.realpath(self.trace_root.path),
            marker=self._marker,
            before_hello=(lambda: self.trace_root.refresh_marker(self._marker)) if self._marker else None,
            # The step alarm (heartbeat.py) watches the step ring: a process without one has nothing to report early.
            early_heartbeat=self._heartbeats.early if self.ring is not None else None,
        )
        # A process that receives requests (a window role, the API server) asks for request-scoped
        # captures from its event loop; step-driven processes only record them.
        self.request_captures: RequestCaptureAsks | None = None
        if not self.identity.step_driven:
            self.request_captures = RequestCaptureAsks(self._link.send, self._link.connected,
                                                       endpoint or config.endpoint())
        self._queries = QueryAnswerer(
            send=self._link.send, recorder_dump=self.recorder_dump,
            recorder_file=lambda query_id, packed=False: self.trace_root.recorder_file(
                query_id, self.identity.probe_file_stem, packed),
            step_thread_id=self._step_thread_id, in_flight=in_flight)

    def start(self) -> "Probe":
        self._link.start()
        return self

    def close(self) -> None:
        self._link.close()
        if self.gpu_memory is not None:
            self.gpu_memory.close()
        self._exporter.shutdown(wait=False)
        self.gc_pauses.uninstall()
        if self._marker:
            self.trace_root.remove_marker(self._marker)

    @property
    def connected(self):
        return self._link.connected

    # -- the step path: keep these lean ------------------------------------------------------------
    def step_begin(self, has_work: bool, now_ns: int = 0) -> None:
        """``now_ns``: the step's start where the engine hook read the clock anyway (0: read here)."""
        ring = self.ring
        if ring is not None:  # StepRing.begin, inline: one call fewer per step (about 80 ns here)
            ring.open_since_ns = now_ns or time_ns()
            if ring.step_thread_id is None:
                ring.step_thread_id = get_ident()
        capture = self._capture
        if capture is not None:
            try:
                capture.on_step_begin(has_work, self.steps)
            except Exception as exc:  # try costs nothing in 3.11+; a profiler error must not reach the engine
                self._abandon(capture, exc)
        scan = self._scan
        if scan is not None:
            scan.on_step_begin(has_work, self.steps)  # SyncScan contains its own errors
        elif self._watch is not None:  # a scan, when one runs, sees every sync anyway
            self._watch.step_begin(has_work, self.steps)  # SyncWatch contains its own errors

    def step_end(self, did_work: bool, batch: int = -1, tokens: int = -1, prefill_tokens: int = -1,
                 decode_tokens: int = -1, running: int = -1, waiting: int = -1, now_ns: int = 0) -> None:
        """The counts are what the engine integration knows of this step (-1: not known here): the
        flight recorder keeps them. ``now_ns``: the step's end where the hook read the clock (0: here)."""
        if did_work:
            self.steps += 1
        ring = self.ring
        if ring is not None:
            # StepRing.end, inline (the same statements, kept in step by a test): one Python call
            # fewer per step, about 50 ns of the recorder's cost here (benchmarks/bench_hooks.py).
            now = now_ns or time_ns()
            written = ring.written
            gpu = ring.gpu
            if gpu is None:
                ring._pack(ring._rows, written % ring._slots * ring._row_bytes, self.steps, ring.open_since_ns or now,
                           now, did_work, batch, tokens, prefill_tokens, decode_tokens, running, waiting)
            else:  # the allocator's bytes: read now where that is cheap, else the sampler's latest (gpu_memory.py)
                if gpu.at_step_end:
                    gpu.read_now()
                ring._pack(ring._rows, written % ring._slots * ring._row_bytes, self.steps, ring.open_since_ns or now,
                           now, did_work, batch, tokens, prefill_tokens, decode_tokens, running, waiting,
                           gpu.allocated, gpu.reserved)
            ring.open_since_ns = 0
            ring.written = written + 1  # after the row: a reader never counts a row being written
        watch = self._watch
        if watch is not None and watch.on:
            watch.step_end()
        capture = self._capture
        if capture is not None:
            try:
                capture.on_step_end(did_work)
            except Exception as exc:
                self._abandon(capture, exc)
            if capture.finished:
                self._capture = None
        scan = self._scan
        if scan is not None:
            scan.on_step_end(did_work)
            if scan.finished:
                self._scan = None

    def end_capture(self, job_id: str, reason: str) -> bool:
        """End the capture ``job_id`` now, on the calling thread, which must be the step thread (an
        engine integration calls it between steps: torch.profiler stops only on the thread that
        started it). An armed capture is cancelled; a recording one stops and exports. False: no such
        capture here (it already ended: its step cap, or another job since)."""
        capture = self._capture
        if capture is None or capture.spec.id != job_id:
            return False
        try:
            capture.end_now(reason)
        except Exception as exc:  # the engine's own call path must not see a profiler error
            self._abandon(capture, exc)
            return True
        if capture.finished:
            self._capture = None
        return True

    def _abandon(self, capture: StepCapture, exc: Exception) -> None:
        log.warning("inference-sidecar: capture %s abandoned: %s", capture.spec.id, exc)
        capture.abandon(f"profiler error on the step path: {exc}")
        self._capture = None

    # -- the link thread ---------------------------------------------------------------------------
    def _on_message(self, msg: FromSidecar) -> None:
        match msg:
            case Arm(spec=spec):
                self._arm(spec)
            case SyncArm(spec=spec):
                self._arm_scan(spec)
            case ModuleArm(spec=spec):
                self._arm_modules(spec)
            case MemoryArm(spec=spec):
                self._arm_memory(spec)
            case Begin(job_id=job_id, start_step=start_step):
                job = self._job(job_id)
                if job is not None:
                    job.begin(start_step)
            case Stop(job_id=job_id, reason=reason):
                job = self._job(job_id)
                if job is not None:
                    job.request_stop(reason)
            case Verdict():
                self._tell_capture_listener(msg)
            case Query():
                self._queries.answer(msg)
            case RequestCaptureAnswer():
                if self.request_captures is not None:
                    self.request_captures.on_answer(msg)
            case Fetch():
                self._link.send(self._files.answer(msg))
            case StepAlarm(threshold_ms=threshold_ms):
                self._heartbeats.set_step_alarm(threshold_ms)
                self._link.wake_heartbeat()  # the heartbeat loop starts (or stops) watching now

    def _job(self, job_id: str):
        """The capture or scan of this probe with that id (ids are unique across kinds); None."""
        for job in (self._capture, self._scan):
            if job is not None and job.spec.id == job_id:
                return job
        return None

    def _arm(self, spec: CaptureSpec) -> None:
        current = self._capture
        if current is not None and not current.finished:
            self._link.send(CaptureReport(job_id=spec.id, state=P_FAILED,
                                          error=f"capture {current.spec.id} still running here"))
            return
        problem = self.limits.steps_problem(spec.steps)
        if problem is None and not self.identity.step_driven and self._loop is None:
            problem = "no event loop known in this process yet"
        if problem is None:
            try:  # the probe's own root, never a path from the message
                path = self.trace_root.capture_file(spec.id, self.identity.probe_file_stem)
            except (ValueError, OSError) as exc:
                problem = f"cannot write a trace here: {exc}"
        if problem is not None:
            log.warning("inference-sidecar: capture %s refused: %s", spec.id, problem)
            self._link.send(CaptureReport(job_id=spec.id, state=P_FAILED, error=clip(problem)))
            return
        if spec.backend == "nsys":
            self._arm_nsys(spec)
            return
        stacks = stack_mode(spec, self.profile.role(self.identity.role))
        if self.identity.step_driven:
            # With a listener (a single-process engine's capture spans) its reports go to it too; else
            # straight to the link, as before.
            report = self._report_capture if self._on_capture_report is not None else self._link.send
            capture = StepCapture(spec, path, report, self._exporter, self.identity.cuda, self.limits, stacks,
                                  self._phase_scopes, self.profile.phase_table(self.identity.role))
            steps_seen = self.steps
            if spec.request_id is not None:
                # Bound to a request that waits for every "armed" before its first step: begin now,
                # from this count, so that step is recorded whenever the sidecar's begin arrives.
                capture.begin(steps_seen)
            self._capture = capture
            capture.report_armed(steps_seen, self._recent_rate())
        else:
            capture = WindowCapture(spec, path, self._report_capture, self._exporter, self._loop, self.identity.cuda,
                                    self.limits, stacks, self._phase_scopes, self.profile.phase_table(self.identity.role))
            self._capture = capture
            capture.start_window()

    def _arm_nsys(self, spec: CaptureSpec) -> None:
        """An nsys capture (capture/nsys.py): step-driven processes only (the sidecar sends it to no other)."""
        try:
            if not self.identity.step_driven:
                raise RuntimeError("an nsys capture marks steps: this process takes none")
            calls = self._cuda_calls if self._cuda_calls is not None else TorchCudaCalls()
        except Exception as exc:
            self._link.send(CaptureReport(job_id=spec.id, state=P_FAILED, error=clip(f"no nsys capture here: {exc}")))
            return
        report = self._report_capture if self._on_capture_report is not None else self._link.send
        capture = NsysCapture(spec, report, calls, self.limits, self._phase_scopes,
                              self.profile.phase_table(self.identity.role))
        self._capture = capture
        capture.report_armed(self.steps, self._recent_rate())

    def _arm_modules(self, spec: ModuleSpec) -> None:
        """A module-timing job in the second slot (modules_job.py); refused where no model is known."""
        problem = self._second_slot_problem(spec) or (
            "this process has no model known to its probe" if self._model is None else None)
        if problem is not None:
            self._refuse("module timing", ModuleReport, spec.id, problem)
            return
        self._take_second_slot(ModuleTiming(spec, self._link.send, self._model, self._exporter, cuda=self.identity.cuda))

    def _arm_memory(self, spec: MemorySpec) -> None:
        """A memory snapshot in the second slot (memory_job.py); refused without CUDA or a step loop."""
        problem, path = self._second_slot_problem(spec), ""
        if problem is None and (not self.identity.cuda or not self.identity.step_driven):
            problem = "this process has no CUDA caching allocator to record (no CUDA, or no engine steps)"
        if problem is None:
            try:  # the probe's own root, never a path from the message
                path = self.trace_root.capture_file(spec.id, self.identity.probe_file_stem)[: -len(".json")]
                path += MEMORY_SUFFIX
            except (ValueError, OSError) as exc:
                problem = f"cannot write a snapshot here: {exc}"
        if problem is not None:
            self._refuse("memory snapshot", MemoryReport, spec.id, problem)
            return
        allocator = self._allocator if self._allocator is not None else TorchAllocator()
        self._take_second_slot(MemorySnapshot(spec, self._link.send, allocator, self._exporter, path,
                                              max_bytes=min(spec.max_bytes, self.limits.max_trace_bytes)))

    def _arm_scan(self, spec: SyncSpec) -> None:
        problem = self._second_slot_problem(spec, "scan")
        if problem is not None:
            self._refuse("scan", SyncReport, spec.id, problem)
            return
        try:
            scan = sync_tools.new_scan(spec, self._link.send, self.profile)
        except Exception as exc:
            self._link.send(SyncReport(job_id=spec.id, state=P_FAILED, error=clip(f"cannot start a scan here: {exc}")))
            return
        self._take_second_slot(scan)

    # -- the second slot: a sync scan, a module timing or a memory snapshot, one at a time --------------
    def _second_slot_problem(self, spec, held_name: str = "job") -> str | None:
        """Why a job of the second slot cannot be armed here on its face (None: it can): the slot is
        held by a job still running (named ``<held_name> <id>``), or its steps are over the limit."""
        current = self._scan
        if current is not None and not current.finished:
            return f"{held_name} {current.spec.id} still running here"
        return self.limits.steps_problem(spec.steps)

    def _refuse(self, what: str, report, job_id: str, problem: str) -> None:
        log.warning("inference-sidecar: %s %s refused: %s", what, job_id, problem)
        self._link.send(report(job_id=job_id, state=P_FAILED, error=clip(problem)))

    def _take_second_slot(self, job) -> None:
        """``job`` holds the second slot from now on, bounded in time like a capture, and says so."""
        job.limit_time(self.limits.max_capture_s, self.limits.duration_reason)
        self._scan = job
        job.report_armed(self.steps, self._recent_rate())

    def _report_capture(self, msg: CaptureReport) -> None:
        self._link.send(msg)
        self._tell_capture_listener(msg)

    def _tell_capture_listener(self, msg: CaptureReport | Verdict) -> None:
        if self._on_capture_report is not None:
            try:
                self._on_capture_report(msg)
            except Exception:
                log.debug("inference-sidecar: capture report callback failed", exc_info=True)

    def _recent_rate(self) -> float | None:
        """This process's working steps per second lately (its flight recorder's rows), for "armed"."""
        ring = self.ring
        return ring.recent_rate() if ring is not None else None

    def _step_thread_id(self) -> int | None:
        ring = self.ring
        return ring.step_thread_id if ring is not None else None

    def recorder_dump(self, seconds: float = 0.0, since_ns: int = 0, packed: bool = False) -> dict[str, Any]:
        """This process's flight recorder: its last ``seconds`` (0: all it holds), as the columns of
        each ring (sidecar/probe/flight_ring.py), with the requests in flight where it knows them.
        ``since_ns``: no row that ended before it either (an incremental read: Query.since_ns).
        ``packed``: each ring's rows as they are, cut by the sidecar (Query.packed)."""
        since = time.time_ns() - int(seconds * 1e9) if seconds > 0 else 0
        since = max(since, since_ns)
        dump: dict[str, Any] = {"gc": self.gc_pauses.dump(since, packed=packed)}
        if packed:
            dump["packed"] = PACKED_FORMAT
        if self.ring is not None:
            dump["steps"] = self.ring.dump(since, tail=since_ns > 0, packed=packed)
        if self.request_ring is not None:
            dump["requests"] = self.request_ring.dump(since, packed=packed)
        if self._in_flight is not None:
            try:
                dump["in_flight"] = self._in_flight()
            except Exception as exc:
                dump["in_flight_error"] = clip(str(exc))
        return dump

    def _on_disconnect(self) -> None:
        if self.request_captures is not None:
            self.request_captures.on_disconnect()
        self._heartbeats.reset()  # a new sidecar (or the same, restarted) is told again
        capture = self._capture
        if capture is not None:
            capture.request_stop("sidecar disconnected")
        scan = self._scan
        if scan is not None:
            scan.request_stop("sidecar disconnected")


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False
