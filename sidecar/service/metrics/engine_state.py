"""Gauges of the engine's state as the probes' heartbeats tell it, read when Prometheus scrapes.

- ``sidecar_requests_in_flight``: requests the engine holds and has not finished (queued, prefill,
  decode), summed over the processes that know them (the engine core of each data-parallel rank);
- ``sidecar_request_oldest_age_seconds``: the age of the oldest of them, 0 with none;
- ``sidecar_engine_step_stuck{process, role, pid}``: 1 while that process's step watchdog reports a
  step running over its threshold (``SIDECAR_WATCHDOG_S``), else 0;
- ``sidecar_engine_step_running_seconds{process, role, pid}``: how long the step running at the last
  heartbeat had run, 0 between steps.

Heartbeats come every 2 s, so each value is at most about 2 s old. A request that stays stuck for
minutes shows here while it runs, where a request span only appears when it ends.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.core import GaugeMetricFamily


class EngineStateCollector:
    def __init__(self, probes: Any) -> None:
        self._probes = probes  # a ProbeRegistry

    def collect(self):
        now_ns = time.time_ns()
        count, oldest = 0, None
        stuck = GaugeMetricFamily("sidecar_engine_step_stuck",
                                  "1 while the process's step watchdog reports a step running over its threshold.",
                                  labels=["process", "role", "pid"])
        running = GaugeMetricFamily("sidecar_engine_step_running_seconds",
                                    "How long the step running at the process's last heartbeat had run (0 between steps).",
                                    labels=["process", "role", "pid"])
        for conn in self._probes.all():
            ident = conn.identity
            labels = [ident.label, ident.role, str(ident.pid)]
            if ident.step_driven:
                stuck.add_metric(labels, 1.0 if conn.stuck is not None else 0.0)
                running.add_metric(labels, (conn.open_step_ms or 0.0) / 1000)
            if conn.in_flight is not None:
                count += conn.in_flight.count
                arrived = conn.in_flight.oldest_arrival_ns
                if arrived is not None:
                    oldest = arrived if oldest is None else min(oldest, arrived)
        yield GaugeMetricFamily("sidecar_requests_in_flight",
                                "Requests the engine holds and has not finished (queued, prefill, decode).", value=count)
        yield GaugeMetricFamily("sidecar_request_oldest_age_seconds",
                                "Age of the oldest request in flight (0 with none).",
                                value=max(0.0, (now_ns - oldest) / 1e9) if oldest is not None else 0.0)
        yield stuck
        yield running
