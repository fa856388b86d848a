"""The probe: one per engine process, called by the engine integration on every step.

Engine integrations (``plugins/sidecar_vllm``, ...) call ``step_begin(has_work)`` before and
``step_end(did_work)`` after each engine step. While no capture is armed each call is an attribute
read and a comparison; the link thread swaps a capture in when the sidecar arms one.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from .. import config
from ..protocol import ProcessIdentity, CaptureSpec
from .link import SidecarLink
from .recorder import StepCapture, WindowCapture

log = logging.getLogger(__name__)


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
        engine: str = "",
        endpoint: str | None = None,
        loop=None,
        cuda_available: bool | None = None,
        on_capture_report: Callable[[dict[str, Any]], None] | None = None,
        sync_watch: Any = None,
    ) -> None:
        if cuda_available is None:
            cuda_available = _cuda_available()
        self.identity = ProcessIdentity(
            role=role, pid=os.getpid(), rank=rank, host=socket.gethostname(), cuda=cuda_available, engine=engine
        )
        self.steps = 0  # forward steps since start (steps with work)
        self._capture: StepCapture | None = None
        self._scan = None  # a sidecar.syncs.SyncScan while a hidden-sync scan runs
        self._loop = loop  # asyncio loop for window captures (API server)
        self._on_capture_report = on_capture_report  # also told of window captures (capture spans)
        # The always-on sync watch (sidecar.syncs.watch), step-driven processes only; None when off.
        self._watch, self._watch_note = (sync_watch, None) if sync_watch is not None else _watch_from_environment(self.identity)
        if self._watch is not None:
            self._watch.install()
        self._watch_sent = -1  # the watch version the sidecar last received (-1: none since connecting)
        self._exporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference-sidecar-export")
        self._link = SidecarLink(
            endpoint or config.endpoint(),
            self.identity,
            on_message=self._on_message,
            on_disconnect=self._on_disconnect,
            heartbeat=self._heartbeat,
            warmup=_warm_profiler_imports,
        )

    def start(self) -> "Probe":
        self._link.start()
        return self

    def close(self) -> None:
        self._link.close()
        self._exporter.shutdown(wait=False)

    @property
    def connected(self):
        return self._link.connected

    # -- the step path: keep these lean ------------------------------------------------------------
    def step_begin(self, has_work: bool) -> None:
        capture = self._capture
        if capture is not None:
            try:
                capture.on_step_begin(has_work, self.steps)
            except Exception as exc:  # try costs nothing in 3.11+; a profiler error must not reach the engine
                self._abandon(capture, exc)
        scan = self._scan
        if scan is not None:
            scan.on_step_begin(has_work)  # SyncScan contains its own errors
        elif self._watch is not None:  # a scan, when one runs, sees every sync anyway
            self._watch.step_begin(has_work, self.steps)  # SyncWatch contains its own errors

    def step_end(self, did_work: bool) -> None:
        if did_work:
            self.steps += 1
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

    def _abandon(self, capture: StepCapture, exc: Exception) -> None:
        log.warning("inference-sidecar: capture %s abandoned: %s", capture.spec.id, exc)
        capture.abandon(f"profiler error on the step path: {exc}")
        self._capture = None

    # -- the link thread ---------------------------------------------------------------------------
    def _on_message(self, msg: dict[str, Any]) -> None:
        kind = msg.get("type")
        if kind == "arm":
            self._arm(CaptureSpec.from_dict(msg["capture"]))
        elif kind == "begin":
            capture = self._capture
            if capture is not None and capture.spec.id == msg.get("capture_id"):
                capture.begin(int(msg["start_step"]))
        elif kind == "sync_arm":
            self._arm_scan(msg["scan"])
        elif kind == "sync_stop":
            scan = self._scan
            if scan is not None and scan.spec.id == msg.get("scan_id"):
                scan.request_stop(str(msg.get("reason") or "stopped"))
        elif kind == "stop":
            capture = self._capture
            if capture is not None and capture.spec.id == msg.get("capture_id"):
                capture.request_stop(str(msg.get("reason") or "stopped"))

    def _arm(self, spec: CaptureSpec) -> None:
        current = self._capture
        if current is not None and not current.finished:
            self._link.send({"type": "capture", "capture_id": spec.id, "state": "failed",
                             "steps_recorded": 0, "error": f"capture {current.spec.id} still running here"})
            return
        path = os.path.join(spec.out_dir, self.identity.file_stem + ".json")
        if self.identity.step_driven:
            self._capture = StepCapture(spec, path, self._link.send, self._exporter, self.identity.cuda)
            # The sidecar picks one start step for every process from these counts.
            self._link.send({"type": "capture", "capture_id": spec.id, "state": "armed",
                             "steps_recorded": 0, "steps_seen": self.steps})
        elif self._loop is not None:
            capture = WindowCapture(spec, path, self._report_window, self._exporter, self._loop, self.identity.cuda)
            self._capture = capture
            capture.start_window()
        else:
            self._link.send({"type": "capture", "capture_id": spec.id, "state": "failed",
                             "steps_recorded": 0, "error": "no event loop known in this process yet"})

    def _arm_scan(self, raw_spec: dict[str, Any]) -> None:
        from ..syncs import SyncScan, SyncSpec, from_environment  # only processes that get scanned pay the import

        spec = SyncSpec.from_dict(raw_spec)
        current = self._scan
        if current is not None and not current.finished:
            self._link.send({"type": "sync", "scan_id": spec.id, "state": "failed", "steps_recorded": 0,
                             "error": f"scan {current.spec.id} still running here"})
            return
        try:
            self._scan = SyncScan(spec, self._link.send, allowlist=from_environment())
        except Exception as exc:
            self._link.send({"type": "sync", "scan_id": spec.id, "state": "failed", "steps_recorded": 0,
                             "error": f"cannot start a scan here: {exc}"})

    def _report_window(self, msg: dict[str, Any]) -> None:
        self._link.send(msg)
        if self._on_capture_report is not None:
            try:
                self._on_capture_report(msg)
            except Exception:
                log.debug("inference-sidecar: capture report callback failed", exc_info=True)

    def _heartbeat(self) -> dict[str, Any]:
        """The heartbeat's payload (link thread): step count, and the watch's report when it has
        changed since the sidecar last got it."""
        beat: dict[str, Any] = {"steps": self.steps}
        watch = self._watch
        if watch is not None and watch.version != self._watch_sent:
            self._watch_sent = watch.version
            beat["sync_watch"] = watch.report()
        elif self._watch_note is not None and self._watch_sent == -1:
            self._watch_sent = 0
            beat["sync_watch"] = {"state": "unavailable", "reason": self._watch_note, "sites": []}
        return beat

    def _on_disconnect(self) -> None:
        self._watch_sent = -1  # a new sidecar (or the same, restarted) needs the report again
        capture = self._capture
        if capture is not None:
            capture.request_stop("sidecar disconnected")
        scan = self._scan
        if scan is not None:
            scan.request_stop("sidecar disconnected")


def _watch_from_environment(identity: ProcessIdentity) -> tuple[Any, str | None]:
    """(SyncWatch, None) where SIDECAR_SYNC_WATCH=1 and this process can run one; (None, why not)
    where it is asked for but cannot run; (None, None) where it is off or not for this process."""
    from ..syncs import settings

    if not settings.watch_enabled() or not identity.step_driven:
        return None, None
    from ..syncs.watch import SyncWatch, cuda_unavailable_reason

    reason = cuda_unavailable_reason()
    if reason is not None:
        log.warning("inference-sidecar: %s=1 but the sync watch cannot run here: %s", settings.ENV_WATCH, reason)
        return None, reason
    from ..syncs.allowlist import from_environment

    return SyncWatch(every=settings.watch_every(), allowlist=from_environment()), None


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False
