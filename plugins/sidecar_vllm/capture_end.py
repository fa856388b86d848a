"""Ending a capture on vLLM's step threads, between steps: how a request-scoped capture ends with its
request even when the engine goes idle right after it.

torch.profiler stops only on the thread that started it, the engine's step thread, and an idle engine
takes no step: a stop request would wait for a step that never comes, and the capture would lose its
processes. vLLM itself has a way onto those threads between steps, the one its own ``/stop_profile``
uses: a utility call from the API server runs on the engine core's busy-loop thread, and the engine
core's ``collective_rpc`` runs a method on each worker's busy-loop thread; both are the threads that
run the steps. So the API server calls ``END_CAPTURE`` on the engine core (request_capture.py),
which ends its own capture and then calls the same method on every worker.

The methods are added to vLLM's classes (there is nothing of vLLM's to wrap); each probe ends the
capture only if it still holds one of that id (``Probe.end_capture``): one that reached its step cap,
or a later job, is left alone.
"""

from __future__ import annotations

import importlib
import logging

from sidecar.integration.attach import PROBE_ATTR
from sidecar.common.protocol import REQUEST_ENDED

log = logging.getLogger(__name__)

END_CAPTURE = "_inference_sidecar_end_capture"


def end_capture_in_engine_core(self, capture_id: str) -> bool:
    """On the engine core's busy-loop thread (a utility call): its capture, then every worker's."""
    probe = self.__dict__.get(PROBE_ATTR)
    ended = probe.end_capture(capture_id, REQUEST_ENDED) if probe is not None else False
    try:
        self.collective_rpc(END_CAPTURE, args=(capture_id,))
    except Exception as exc:  # a worker without this plugin, an executor that cannot: its capture ends at its cap
        log.warning("inference-sidecar: capture %s not ended in the workers: %s", capture_id, exc)
    return ended


def end_capture_in_worker(self, capture_id: str) -> bool:
    """On a worker's busy-loop thread (``collective_rpc``)."""
    probe = self.__dict__.get(PROBE_ATTR)
    return probe.end_capture(capture_id, REQUEST_ENDED) if probe is not None else False


METHODS = (
    ("vllm.v1.engine.core", "EngineCore", end_capture_in_engine_core),
    ("vllm.v1.worker.gpu_worker", "Worker", end_capture_in_worker),  # CPU, XPU, ... workers subclass it
)


def install() -> None:
    """Add ``END_CAPTURE`` to vLLM's engine core and worker (idempotent; a failure is logged)."""
    for module_name, class_name, method in METHODS:
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
            if END_CAPTURE not in cls.__dict__:
                setattr(cls, END_CAPTURE, method)
        except Exception as exc:
            log.warning("inference-sidecar: cannot add %s to %s.%s: %s", END_CAPTURE, module_name, class_name, exc)
