"""Per-device GPU utilisation, memory, power and temperature through NVML (nvidia-ml-py).

``GpuSampler.create`` returns None when there is no NVML library or driver, after one log line: the
GPU metrics are then absent, never an error per sample. A reading a device does not support (power on
some boards, for one) is skipped for that device from then on, also with a single log line.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from opentelemetry.metrics import Meter

from .instruments import GPU_MEMORY_LIMIT, GPU_MEMORY_USAGE, GPU_POWER, GPU_TEMPERATURE, GPU_UTILIZATION

log = logging.getLogger(__name__)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class GpuSampler:
    def __init__(self, meter: Meter, nvml: Any, handles: list[Any]) -> None:
        self._nvml = nvml
        self._devices = []
        for index, handle in enumerate(handles):
            attrs = {"hw.type": "gpu", "hw.id": _text(nvml.nvmlDeviceGetUUID(handle)),
                     "hw.name": _text(nvml.nvmlDeviceGetName(handle)), "gpu.index": index}
            self._devices.append((handle, attrs))
        self._util = meter.create_gauge(GPU_UTILIZATION, unit="1", description="Fraction of time the GPU was busy.")
        self._mem_used = meter.create_gauge(GPU_MEMORY_USAGE, unit="By", description="GPU memory used.")
        self._mem_total = meter.create_gauge(GPU_MEMORY_LIMIT, unit="By", description="GPU memory size.")
        self._power = meter.create_gauge(GPU_POWER, unit="W", description="GPU power draw.")
        self._temp = meter.create_gauge(GPU_TEMPERATURE, unit="Cel", description="GPU temperature.")
        self._unsupported: set[tuple[int, str]] = set()

    @classmethod
    def create(cls, meter: Meter, nvml: Any = None) -> "GpuSampler | None":
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                log.info("inference-sidecar: nvidia-ml-py is not installed; no GPU metrics")
                return None
        try:
            nvml.nvmlInit()
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as exc:
            log.info("inference-sidecar: no NVIDIA driver (%s); GPU metrics are off", exc)
            return None
        if not handles:
            log.info("inference-sidecar: NVML sees no GPU; GPU metrics are off")
            return None
        return cls(meter, nvml, handles)

    def _read(self, index: int, what: str, read: Callable[[], float], record: Callable, attrs: dict) -> None:
        if (index, what) in self._unsupported:
            return
        try:
            value = read()
        except self._nvml.NVMLError as exc:
            self._unsupported.add((index, what))
            log.info("inference-sidecar: GPU %d: %s not readable (%s); not sampled again", index, what, exc)
            return
        record(value, attrs)

    def sample(self) -> None:
        nvml = self._nvml
        for index, (handle, attrs) in enumerate(self._devices):
            self._read(index, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                       self._util.set, attrs)
            memory: list = []

            def mem() -> float:
                memory.append(nvml.nvmlDeviceGetMemoryInfo(handle))
                return float(memory[0].used)

            self._read(index, "memory", mem, self._mem_used.set, attrs)
            if memory:
                self._mem_total.set(float(memory[0].total), attrs)
            self._read(index, "power", lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, self._power.set, attrs)
            self._read(index, "temperature", lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                       self._temp.set, attrs)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass
