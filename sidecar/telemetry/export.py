"""The bounded span export path: the caller never waits on the backend.

``on_end`` puts the span in a bounded queue (a lock and an append). A daemon thread exports batches.
When the queue is full the oldest span is dropped; when an export fails its batch is dropped; either
way the drop is counted (``dropped``, and ``on_drop(count, reason)``, which telemetry setup wires to
the ``sidecar.telemetry.spans.dropped`` counter) and logged once per outage, not per span.
Modelled on the OpenTelemetry SDK's batch processor, which drops but only logs.

``shutdown`` is bounded: it gives the thread one last round of at most ``timeout_millis`` (1 s by
default, not the SDK's 30 s: ``TracerProvider.shutdown`` passes none), then shuts the exporter down,
which ends an OTLP exporter's retries (backoff for up to ``OTEL_EXPORTER_OTLP_TIMEOUT``, 10 s, against
a dead endpoint). What is still queued then is dropped and counted (``shutdown``).
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from typing import Callable

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger(__name__)

DROP_QUEUE_FULL = "queue_full"
DROP_EXPORT_FAILED = "export_failed"
DROP_SHUTDOWN = "shutdown"
SHUTDOWN_TIMEOUT_MS = 1000


class BoundedSpanProcessor(SpanProcessor):
    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = 2048,
        max_batch_size: int = 512,
        schedule_delay_s: float = 5.0,
        on_drop: Callable[[int, str], None] | None = None,
    ) -> None:
        if max_queue_size < 1 or max_batch_size < 1 or schedule_delay_s <= 0:
            raise ValueError("queue size, batch size and delay must be positive")
        self._exporter = exporter
        self._max_queue = max_queue_size
        self._max_batch = min(max_batch_size, max_queue_size)
        self._delay = schedule_delay_s
        self._on_drop = on_drop
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._flushed = threading.Condition(threading.Lock())
        self._exports_done = 0
        self._shutdown = False
        self._outage = False  # logged once per run of drops
        self.dropped = 0
        self.exported = 0
        self._start_thread()
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (m := ref()) and m())

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._work, name="sidecar-span-export", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:  # the thread does not survive a fork; the child starts empty
        self._queue.clear()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._flushed = threading.Condition(threading.Lock())
        if not self._shutdown:
            self._start_thread()

    # -- the caller's side -------------------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if not span.context.trace_flags.sampled:
            return
        if self._shutdown:
            self._drop(1, DROP_SHUTDOWN)
            return
        with self._lock:
            full = len(self._queue) >= self._max_queue
            if full:
                self._queue.popleft()
            self._queue.append(span)
            size = len(self._queue)
        if full:
            self._drop(1, DROP_QUEUE_FULL)
        if size >= self._max_batch:
            self._wake.set()

    def _drop(self, count: int, reason: str) -> None:
        self.dropped += count
        if not self._outage:
            self._outage = True
            log.warning("inference-sidecar: dropping spans (%s); is the trace backend reachable? "
                        "Drops are counted in sidecar.telemetry.spans.dropped", reason)
        if self._on_drop is not None:
            try:
                self._on_drop(count, reason)
            except Exception:  # a metrics problem must not break span export
                log.debug("on_drop callback failed", exc_info=True)

    # -- the export thread ---------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._export_all()
            with self._flushed:
                self._exports_done += 1
                self._flushed.notify_all()
            if self._shutdown:
                return

    def _take(self) -> list[ReadableSpan]:
        with self._lock:
            n = min(len(self._queue), self._max_batch)
            return [self._queue.popleft() for _ in range(n)]

    def _export_all(self) -> None:
        while True:
            batch = self._take()
            if not batch:
                return
            try:
                ok = self._exporter.export(batch) == SpanExportResult.SUCCESS
            except Exception as exc:
                log.debug("span export raised: %s", exc)
                ok = False
            if ok:
                self.exported += len(batch)
                if self._outage:
                    self._outage = False
                    log.info("inference-sidecar: span export works again (%d spans dropped so far)", self.dropped)
            else:
                self._drop(len(batch), DROP_EXPORT_FAILED)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        if self._shutdown and not self._thread.is_alive():
            return True
        deadline = time.monotonic() + timeout_millis / 1000
        with self._flushed:
            target = self._exports_done + 2  # one full round that starts after this call
            self._wake.set()
            while self._exports_done < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.set()
                self._flushed.wait(min(left, 0.05))
        return True

    def shutdown(self, timeout_millis: float = SHUTDOWN_TIMEOUT_MS) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        self._wake.set()
        self._thread.join(max(0.0, timeout_millis / 1000))
        # An export still retrying gives up at once (the OTLP exporters wait out their backoff on an
        # event that shutdown sets); the thread is a daemon, so a request still in flight never holds
        # the process. A span that can no longer be exported is counted, like every other drop.
        self._exporter.shutdown()
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
        if left:
            self._drop(left, DROP_SHUTDOWN)
