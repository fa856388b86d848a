"""GPU activity of one process: kernel totals and top kernels, busy time per device and per stream,
memcpy / memset time by direction.

"Busy" is the union of kernel intervals: time when at least one kernel ran. Memcpy and memset are
reported apart (they run on copy engines and can overlap kernels) and do not count as busy.
"""

from __future__ import annotations

from collections import defaultdict
import msgspec
from typing import Iterable

import numpy as np

from . import intervals
from ..reader.arrays import distinct, groups
from ..reader.events import Kind, memcpy_direction
from ..reader.view import ProcessView


class NameStat(msgspec.Struct):
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


class StreamStat(msgspec.Struct):
    device: int
    stream: int
    kernel_count: int = 0
    kernel_time: float = 0.0
    busy: float = 0.0


class CopyStat(msgspec.Struct):
    count: int = 0
    total: float = 0.0
    nbytes: int = 0


class GpuStats(msgspec.Struct):
    """Everything about the GPU side of one process (or, merged, of a whole trace)."""

    kernels: dict[str, NameStat] = msgspec.field(default_factory=dict)
    kernel_count: int = 0
    kernel_time: float = 0.0
    device_busy: dict[int, intervals.Spans] = msgspec.field(default_factory=dict)
    device_span: dict[int, tuple[float, float]] = msgspec.field(default_factory=dict)  # first kernel start, last end
    device_window: dict[int, tuple[float, float]] = msgspec.field(default_factory=dict)  # the owning process's window
    streams: dict[tuple[int, int], StreamStat] = msgspec.field(default_factory=dict)
    copies: dict[str, CopyStat] = msgspec.field(default_factory=dict)  # "HtoD", "DtoH", ..., "Memset"
    device_process: dict[int, str] = msgspec.field(default_factory=dict)  # merged: whose device it is

    @property
    def busy(self) -> float:
        return sum(intervals.total(u) for u in self.device_busy.values())

    @property
    def span(self) -> float:
        """Sum over devices of the window their process was captured for."""
        return sum(hi - lo for lo, hi in self.device_window.values())


def name_stats(name_ids: np.ndarray, dur: np.ndarray) -> dict[int, NameStat]:
    """Count, total, min and max of ``dur`` per name id, in order of first appearance (the order
    a Python loop would have created them in; totals are summed in event order by bincount)."""
    if not len(name_ids):
        return {}
    uniq, first, inverse = groups(name_ids)
    counts = np.bincount(inverse, minlength=len(uniq))
    totals = np.bincount(inverse, weights=dur, minlength=len(uniq))
    mins = np.full(len(uniq), np.inf)
    np.minimum.at(mins, inverse, dur)
    maxs = np.zeros(len(uniq))
    np.maximum.at(maxs, inverse, dur)
    out: dict[int, NameStat] = {}
    for g in np.argsort(first, kind="stable").tolist():
        out[int(uniq[g])] = NameStat(int(counts[g]), float(totals[g]), float(mins[g]), float(maxs[g]))
    return out


def groups_in_order(*keys: np.ndarray) -> list[tuple[tuple, np.ndarray]]:
    """Rows grouped by equal keys: [(key values, row indices)], groups in order of first
    appearance, rows in their original order."""
    if not len(keys[0]):
        return []
    stacked = np.stack(keys, axis=1)
    _uniq, first, inverse = np.unique(stacked, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    rows = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse))
    out = []
    for g in np.argsort(first, kind="stable").tolist():
        pick = rows[(bounds[g - 1] if g else 0) : bounds[g]]
        out.append((tuple(int(v) for v in stacked[first[g]]), pick))
    return out


def gpu_stats(view: ProcessView, window: tuple[float, float]) -> GpuStats:
    names = view.data.names
    ts, dur, kind, name, device, stream, nbytes = view.columns("ts", "dur", "kind", "name", "device", "stream", "nbytes")
    stats = GpuStats()
    copy = np.flatnonzero(kind != Kind.KERNEL)
    if len(copy):
        labels = {nid: memcpy_direction(names[nid]) for nid in distinct(name[copy]).tolist()}
        label = ["Memset" if k == Kind.MEMSET else labels[n] for k, n in zip(kind[copy].tolist(), name[copy].tolist())]
        for lab, d, b in zip(label, dur[copy].tolist(), nbytes[copy].tolist()):
            stat = stats.copies.setdefault(lab, CopyStat())
            stat.count += 1
            stat.total += d
            stat.nbytes += b
    k = np.flatnonzero(kind == Kind.KERNEL)
    ts, dur, name, device, stream = ts[k], dur[k], name[k], device[k], stream[k]
    by_name = name_stats(name, dur)
    for nid, stat in by_name.items():
        stats.kernels[names[nid]] = stat  # names are interned: one id per distinct name
    stats.kernel_count = sum(s.count for s in by_name.values())
    stats.kernel_time = sum(s.total for s in by_name.values())
    end = ts + dur
    per_device: dict[int, list[intervals.Spans]] = defaultdict(list)
    for (dev, strm), rows in groups_in_order(device, stream):
        busy = intervals.union(ts[rows], end[rows])
        stats.streams[(dev, strm)] = StreamStat(dev, strm, len(rows), intervals.seq_sum(end[rows] - ts[rows]), intervals.total(busy))
        per_device[dev].append(busy)
    for dev, parts in per_device.items():
        union = intervals.union(*intervals.concat(parts))
        stats.device_busy[dev] = union
        stats.device_span[dev] = (float(union.start[0]), float(union.end[-1]))
        stats.device_window[dev] = window
    return stats


def busy_union(view: ProcessView) -> intervals.Spans:
    """The union of the process's kernel intervals over all its devices: the same spans as the union
    of ``gpu_stats``' per-device unions (a union of unions is the union of the parts), for callers
    that need only this (the sync finding of ``sidecar.analysis.sync_sites``)."""
    ts, dur, kind = view.columns("ts", "dur", "kind")
    k = np.flatnonzero(kind == Kind.KERNEL)
    return intervals.union(ts[k], ts[k] + dur[k])


def merge(parts: Iterable[GpuStats], labels: Iterable[str] = ()) -> GpuStats:
    """Aggregate over processes. Devices of different processes stay apart: a busy union only
    makes sense on one GPU, so merged devices are keyed by (process index, device), and each is
    labelled with its process (``labels``, in the order of ``parts``)."""
    out = GpuStats()
    labels = list(labels)
    for n, part in enumerate(parts):
        for kname, stat in part.kernels.items():
            out.kernels.setdefault(kname, NameStat()).merge(stat)
        out.kernel_count += part.kernel_count
        out.kernel_time += part.kernel_time
        for dev, union in part.device_busy.items():
            out.device_busy[(n, dev)] = union  # type: ignore[index]
            out.device_span[(n, dev)] = part.device_span[dev]  # type: ignore[index]
            out.device_window[(n, dev)] = part.device_window[dev]  # type: ignore[index]
            if n < len(labels):
                out.device_process[(n, dev)] = labels[n]  # type: ignore[index]
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
                "process": stats.device_process.get(dev),
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
    """Microseconds, kept to the nanosecond. numpy scalars become plain floats; a plain int (an
    empty ``sum()``) stays an int, so the JSON text is what it always was."""
    return round(value if type(value) is int else float(value), 3)


def ratio(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole > 0 else 0.0
