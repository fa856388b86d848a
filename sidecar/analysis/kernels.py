"""GPU activity of one process: kernel totals and top kernels, busy time per device and per stream,
memcpy / memset time by direction.

"Busy" is the union of kernel intervals: time when at least one kernel ran. Memcpy and memset are
reported apart (they run on copy engines and can overlap kernels) and do not count as busy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

from . import intervals
from .events import Kind, memcpy_direction
from .processes import ProcessView


@dataclass
class NameStat:
    count: int = 0
    total: float = 0.0
    min: float = float("inf")
    max: float = 0.0

    def add(self, dur: float) -> None:
        self.count += 1
        self.total += dur
        if dur < self.min:
            self.min = dur
        if dur > self.max:
            self.max = dur

    def merge(self, other: "NameStat") -> None:
        self.count += other.count
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)


@dataclass
class StreamStat:
    device: int
    stream: int
    kernel_count: int = 0
    kernel_time: float = 0.0
    busy: float = 0.0


@dataclass
class CopyStat:
    count: int = 0
    total: float = 0.0
    nbytes: int = 0


@dataclass
class GpuStats:
    """Everything about the GPU side of one process (or, merged, of a whole trace)."""

    kernels: dict[str, NameStat] = field(default_factory=dict)
    kernel_count: int = 0
    kernel_time: float = 0.0
    device_busy: dict[int, list[intervals.Interval]] = field(default_factory=dict)
    device_span: dict[int, tuple[float, float]] = field(default_factory=dict)  # first kernel start, last end
    device_window: dict[int, tuple[float, float]] = field(default_factory=dict)  # the owning process's window
    streams: dict[tuple[int, int], StreamStat] = field(default_factory=dict)
    copies: dict[str, CopyStat] = field(default_factory=dict)  # "HtoD", "DtoH", ..., "Memset"

    @property
    def busy(self) -> float:
        return sum(intervals.total(u) for u in self.device_busy.values())

    @property
    def span(self) -> float:
        """Sum over devices of the window their process was captured for."""
        return sum(hi - lo for lo, hi in self.device_window.values())


def gpu_stats(view: ProcessView, window: tuple[float, float]) -> GpuStats:
    gpu = view.gpu
    names = view.data.names
    by_name: dict[int, NameStat] = defaultdict(NameStat)
    by_stream: dict[tuple[int, int], list[intervals.Interval]] = defaultdict(list)
    copies: dict[str, CopyStat] = defaultdict(CopyStat)
    ts, dur, kind, name, device, stream, nbytes = gpu.ts, gpu.dur, gpu.kind, gpu.name, gpu.device, gpu.stream, gpu.nbytes
    for i in view.gpu_index:
        d = dur[i]
        k = kind[i]
        if k == Kind.KERNEL:
            by_name[name[i]].add(d)
            start = ts[i]
            by_stream[(device[i], stream[i])].append((start, start + d))
        else:
            label = "Memset" if k == Kind.MEMSET else memcpy_direction(names[name[i]])
            stat = copies[label]
            stat.count += 1
            stat.total += d
            stat.nbytes += nbytes[i]
    stats = GpuStats(copies=dict(copies))
    for nid, stat in by_name.items():
        stats.kernels[names[nid]] = stat  # names are interned: one id per distinct name
    stats.kernel_count = sum(s.count for s in by_name.values())
    stats.kernel_time = sum(s.total for s in by_name.values())
    per_device: dict[int, list[intervals.Interval]] = defaultdict(list)
    for (dev, strm), pairs in by_stream.items():
        busy = intervals.union(pairs)
        stats.streams[(dev, strm)] = StreamStat(dev, strm, len(pairs), sum(e - s for s, e in pairs), intervals.total(busy))
        per_device[dev].extend(busy)
    for dev, pairs in per_device.items():
        union = intervals.union(pairs)
        stats.device_busy[dev] = union
        stats.device_span[dev] = (union[0][0], union[-1][1])
        stats.device_window[dev] = window
    return stats


def merge(parts: Iterable[GpuStats]) -> GpuStats:
    """Aggregate over processes. Devices of different processes stay apart: a busy union only
    makes sense on one GPU, so merged devices are keyed by (process index, device)."""
    out = GpuStats()
    for n, part in enumerate(parts):
        for kname, stat in part.kernels.items():
            out.kernels.setdefault(kname, NameStat()).merge(stat)
        out.kernel_count += part.kernel_count
        out.kernel_time += part.kernel_time
        for dev, union in part.device_busy.items():
            out.device_busy[(n, dev)] = union  # type: ignore[index]
            out.device_span[(n, dev)] = part.device_span[dev]  # type: ignore[index]
            out.device_window[(n, dev)] = part.device_window[dev]  # type: ignore[index]
        for key, stat in part.streams.items():
            out.streams[(n, *key)] = stat  # type: ignore[index]
        for label, copy in part.copies.items():
            acc = out.copies.setdefault(label, CopyStat())
            acc.count += copy.count
            acc.total += copy.total
            acc.nbytes += copy.nbytes
    return out


def top(stats: dict[str, NameStat], n: int, total_time: float) -> list[dict]:
    ranked = sorted(stats.items(), key=lambda item: (-item[1].total, item[0]))[:n]
    return [
        {
            "name": kname,
            "count": s.count,
            "total_us": us(s.total),
            "mean_us": us(s.total / s.count) if s.count else 0.0,
            "min_us": us(s.min) if s.count else 0.0,
            "max_us": us(s.max),
            "fraction": ratio(s.total, total_time),
        }
        for kname, s in ranked
    ]


def to_json(stats: GpuStats, top_n: int) -> dict:
    """The ``gpu`` object of the summary (see docs/analysis.md). Times of day are relative to the
    start of the owning process's window."""
    busy = stats.busy
    span = stats.span
    devices = []
    for dev in sorted(stats.device_busy, key=str):
        union = stats.device_busy[dev]
        dev_busy = intervals.total(union)
        lo, hi = stats.device_window[dev]
        streams = [s for key, s in stats.streams.items() if _device_of(key) == dev]
        devices.append(
            {
                "device": dev if not isinstance(dev, tuple) else dev[1],
                "busy_us": us(dev_busy),
                "span_us": us(hi - lo),
                "busy_fraction": ratio(dev_busy, hi - lo),
                "kernel_count": sum(s.kernel_count for s in streams),
                "kernel_time_us": us(sum(s.kernel_time for s in streams)),
                "first_kernel_at_us": us(stats.device_span[dev][0] - lo),
                "last_kernel_end_at_us": us(stats.device_span[dev][1] - lo),
                "streams": [
                    {"stream": s.stream, "kernel_count": s.kernel_count, "kernel_time_us": us(s.kernel_time), "busy_us": us(s.busy)}
                    for s in sorted(streams, key=lambda s: s.stream)
                ],
            }
        )
    return {
        "kernel_count": stats.kernel_count,
        "kernel_time_us": us(stats.kernel_time),
        "busy_us": us(busy),
        "span_us": us(span),
        "busy_fraction": ratio(busy, span),
        "idle_us": us(span - busy),
        "top_kernels": top(stats.kernels, top_n, stats.kernel_time),
        "devices": devices,
        "memcpy": {
            label: {"count": c.count, "total_us": us(c.total), "bytes": c.nbytes}
            for label, c in sorted(stats.copies.items())
        },
    }


def _device_of(stream_key: tuple) -> object:
    return stream_key[0] if len(stream_key) == 2 else (stream_key[0], stream_key[1])


def us(value: float) -> float:
    """Microseconds, kept to the nanosecond."""
    return round(value, 3)


def ratio(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole > 0 else 0.0
