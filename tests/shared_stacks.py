"""The two vLLM stacks the end-to-end tests share beyond the session's plain one, and their parts
(not a test module). A vLLM server start costs 40-70 s on a 2-core host, so each is started once and
used by several test files in turn, the last of which ends it (``ReusedStack``: a test that finds the
stack ended, run alone or in another order, gets a fresh one). Both start with the session, one after
the other behind the session's own stack (tests/conftest.py ``_shared_stacks``), while the trace
analysis tests leave a core idle; the files that use them (tests/e2e/conftest.py) run in name order:

- ``fixture_models``: test_vllm_incidents.py, test_vllm_slow_token_fixture.py, test_vllm_syncs.py,
  test_vllm_triggers.py, test_vllm_triggers_alertmanager.py, then test_vllm_worker_killed.py kills its worker.
- ``fault_stack``: test_vllm_disk_full.py, test_vllm_faults.py (the trace backend outage), then
  test_vllm_shutdown.py SIGTERMs its sidecar and its server.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Protocol

from background_start import ENVIRON_AT_START
from sidecar.devtools.stack import Stack, free_port
from sidecar_vllm.devtools import VllmStack


class Waitable(Protocol):
    """A start another waits for: ``BackgroundStart``, ``ReusedStack``."""

    def wait(self) -> None: ...


SMALL_DISK_MB = 24
SMALL_DISK_FLOOR_MB = 1  # the sidecar's --min-free-mb there: low, so that a capture can start with little room left


class SmallDisk:
    """A process holding a user + mount namespace in which ``folder`` is a tmpfs of ``mb`` MiB."""

    def __init__(self, folder: Path, mb: int) -> None:
        for tool in ("unshare", "nsenter"):
            assert shutil.which(tool), f"{tool} (util-linux) is needed to give the test a small disk"
        folder.mkdir(parents=True)
        self.folder = folder
        self._holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
             f"mount -t tmpfs -o size={mb}m tmpfs '{folder}' && echo mounted && exec sleep 100000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self._holder.stdout.readline().strip()
        if line != "mounted":
            self._holder.kill()
            raise RuntimeError(f"cannot mount a tmpfs in a user namespace here: {self._holder.stderr.read().strip()}")

    @property
    def launcher(self) -> tuple[str, ...]:
        """Runs a command inside the namespace, as the same user (uid 0 inside maps to it)."""
        return ("nsenter", "-t", str(self._holder.pid), "--user", "--mount", "--preserve-credentials", "--")

    def seen(self, path: Path) -> Path:
        """``path`` inside the namespace, as this process can reach it."""
        return Path(f"/proc/{self._holder.pid}/root") / path.relative_to("/")

    def used_bytes(self) -> int:
        st = os.statvfs(self.seen(self.folder))
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def free_bytes(self) -> int:
        st = os.statvfs(self.seen(self.folder))
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        self._holder.kill()
        self._holder.wait(timeout=10)


class ReusedStack:
    """A server start (40-70 s on a 2-core host) shared by tests that run one after the other, the last
    of which ends the stack (SIGTERM, a killed worker). ``make(resources)`` builds a stack, registering
    in ``resources`` what must be released after it (a small disk). ``use`` gives the stack serving: the
    one an earlier test left, else a new one, so each test also passes alone or in another order.
    ``warm`` starts it on a thread of its own ahead of its first ``use``: a start is mostly one core's
    work (each engine process imports and loads in turn), so two overlap on a 2-core host."""

    def __init__(self, make: Callable[[ExitStack], Stack]) -> None:
        self._make = make
        self._stack: Stack | None = None
        self._resources = ExitStack()
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None

    def warm(self, after: "Waitable | None" = None) -> None:
        """``after``: another start this one begins after, whatever its outcome (one core's work at a time)."""
        if self._stack is None and self._starting is None:
            self.close()
            self._starting = threading.Thread(target=self._start, args=(after,), name="stack-start", daemon=True)
            self._starting.start()

    def wait(self) -> None:
        """Until a warm start has ended, started or failed (at once where none is under way)."""
        starting = self._starting
        if starting is not None:
            starting.join()

    def use(self) -> Stack:
        if self._starting is not None:  # a warm start: its outcome, once it has one
            self._starting.join()
            self._starting, error, self._start_error = None, self._start_error, None
            if error is not None:
                self.close()
                raise error
        stack = self._stack
        if stack is None or not all(p is not None and p.poll() is None for p in (stack._server, stack._sidecar)):
            self.close()
            try:
                stack = self._new()
                stack.start()
            except BaseException:
                self.close()
                raise
        return stack

    @contextmanager
    def use_up(self) -> Iterator[Stack]:
        """The stack for a test that ends it; closed after, and the next ``use`` starts a new one."""
        stack = self.use()
        resources, self._stack, self._resources = self._resources, None, ExitStack()
        with resources:
            yield stack

    def close(self) -> None:
        if self._starting is not None:
            self._starting.join()
            self._starting = None
        self._stack = None
        self._resources.close()

    def _new(self) -> Stack:
        """A new stack, not started, in place of a closed one."""
        self._resources = ExitStack()
        stack = self._make(self._resources)
        self._resources.callback(stack.close)
        self._stack = stack
        return stack

    def _start(self, after: "Waitable | None") -> None:
        if after is not None:
            after.wait()
        try:
            self._new().start()
        except BaseException as exc:  # noqa: BLE001 (raised by the next use)
            self._start_error = exc


def fixture_models_builder(tmp_path_factory) -> ReusedStack:
    """The sidecar and real vLLM serving the fixture models in one (tests/fixtures/slow_token_model,
    ``planted=True``): a prompt ending in SLOW_TOKEN_ID makes one 1.5 s step; HANG_TOKEN_ID hangs a step
    until the file ``env[ENV_HANG_RELEASE]`` exists (60 s at most); every forward makes the planted
    syncs, which a sync scan counts (SIDECAR_SYNC_TREAT_CPU_AS_DEVICE=1); the step watchdog is at 3 s; the
    sidecar acts on Alertmanager's TTFT alert (tests/alert_chain.py ``E2E_ALERT_ACTIONS``)."""
    from alert_chain import E2E_ALERT_ACTIONS
    from slow_token_model import ENV_HANG_RELEASE, ENV_HANG_S, make_model_dir

    def make(resources):
        work = tmp_path_factory.mktemp("fixture-models")
        model = make_model_dir(work / "model", planted=True)
        actions = work / "alert-actions.json"
        actions.write_text(json.dumps(E2E_ALERT_ACTIONS))
        return VllmStack(model_dir=model, work_dir=work / "stack", base_env=ENVIRON_AT_START,
                         sidecar_args=("--alert-actions", str(actions)), env={
            "SIDECAR_WATCHDOG_S": "3",
            "SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1",
            ENV_HANG_RELEASE: str(work / "release-hang"),
            ENV_HANG_S: "60",  # released early: the bound only has to outlast a slow host's examination
        })

    return ReusedStack(make)


def fault_stack_builder(tiny_model, tmp_path_factory) -> ReusedStack:
    """vLLM and the sidecar with two faults in waiting. The trace dir, ``stack.disk.folder``, is a tmpfs
    of SMALL_DISK_MB in a user and mount namespace of their own (``SmallDisk``; the sidecar's free-space
    floor SMALL_DISK_FLOOR_MB): it fills when a test fills it. The OTLP endpoint (traces and metrics)
    is ``stack.dead_port``, where nothing listens unless a test puts a backend there: every export is
    refused, retried for up to 10 s (the exporters' default timeout), dropped. Spans leave the queue
    after 0.2 s, and the queue holds 16 (the default 2048 would take minutes of load to fill; 64 did
    not fill on a slow CI runner, whose load made fewer spans than three exports dropped);
    metrics are pushed to the sidecar every second."""
    def make(resources):
        work = tmp_path_factory.mktemp("fault-stack")
        disk = SmallDisk(work / "traces", SMALL_DISK_MB)
        resources.callback(disk.close)
        port = free_port()
        stack = VllmStack(model_dir=tiny_model, work_dir=work / "stack", launcher=disk.launcher,
                          base_env=ENVIRON_AT_START,
                          sidecar_args=("--min-free-mb", str(SMALL_DISK_FLOOR_MB)), env={
                              "SIDECAR_TRACE_DIR": str(disk.folder),
                              "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                              "OTEL_BSP_SCHEDULE_DELAY": "200",
                              "OTEL_BSP_MAX_QUEUE_SIZE": "16",
                              "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "16",  # the SDK's processor (the sidecar's spans) refuses more
                              "SIDECAR_METRICS_PUSH_INTERVAL_MS": "1000",
                          })
        stack.disk, stack.dead_port = disk, port
        return stack

    return ReusedStack(make)
