"""Keep only what the analyses need, in compact arrays, while events stream past.

Per host thread: ts, dur, name id, kind and correlation of every CPU op, annotation, Python frame
and runtime call (about 29 bytes each). Per GPU activity: ts, dur, name id, kind, device, stream,
correlation and bytes (about 45 bytes each). Names are interned to integer ids. Flow arrows,
instant events, counters, GPU-side annotations and everything in ``args`` beyond those few fields
are dropped as they are read, so memory grows with the number of useful events, not with the file.

The per-event loop below stays plain Python on purpose: measured on the largest shared trace it
takes 0.066 s, while building the same columns batch by batch with map/attrgetter passes and
numpy masks took 0.13 s (each batch needs a dozen passes, each a C call per event). The loop
appends to plain lists, moved into the ``array.array`` columns at the end of each batch: 98 -> 84 ms
for the collection of that trace (best of 15, the same batches). At ``finish`` the columns become
numpy arrays without a copy (``np.frombuffer``) for the vectorised analyses.
"""

from __future__ import annotations

from array import array
import msgspec
from typing import TYPE_CHECKING, Hashable, Sequence

from .events import CompleteEvent, Kind, MetadataEvent, RawEvent, category_table, step_number

if TYPE_CHECKING:
    import numpy as np

Pid = Hashable  # an int in Kineto traces; merged or hand-made traces may use strings


class HostThread(msgspec.Struct):
    """Host events of one (pid, tid), in file order (not necessarily sorted by ts). ``array``
    while collecting, numpy arrays (same buffers) once ``Collector.finish`` has run."""

    ts: array = msgspec.field(default_factory=lambda: array("d"))
    dur: array = msgspec.field(default_factory=lambda: array("d"))
    name: array = msgspec.field(default_factory=lambda: array("i"))
    kind: array = msgspec.field(default_factory=lambda: array("b"))
    corr: array = msgspec.field(default_factory=lambda: array("q"))  # -1 when the event has none


class GpuActivities(msgspec.Struct):
    """Kernels, memcpys and memsets, in file order (``array``, then numpy, as HostThread)."""

    ts: array = msgspec.field(default_factory=lambda: array("d"))
    dur: array = msgspec.field(default_factory=lambda: array("d"))
    name: array = msgspec.field(default_factory=lambda: array("i"))
    kind: array = msgspec.field(default_factory=lambda: array("b"))
    device: array = msgspec.field(default_factory=lambda: array("q"))
    stream: array = msgspec.field(default_factory=lambda: array("q"))
    corr: array = msgspec.field(default_factory=lambda: array("q"))
    nbytes: array = msgspec.field(default_factory=lambda: array("q"))
    track: array = msgspec.field(default_factory=lambda: array("i"))  # index into TraceData.tracks

    def __len__(self) -> int:
        return len(self.ts)


class StepMark(msgspec.Struct, frozen=True):
    """One ``ProfilerStep#n`` range on the host."""

    pid: Pid
    tid: Pid
    number: int
    ts: float
    dur: float


class TraceData(msgspec.Struct):
    """Everything kept from one trace file."""

    path: str
    names: list[str] = msgspec.field(default_factory=list)
    threads: dict[tuple[Pid, Pid], HostThread] = msgspec.field(default_factory=dict)
    gpu: GpuActivities = msgspec.field(default_factory=GpuActivities)
    steps: list[StepMark] = msgspec.field(default_factory=list)
    tracks: list[Pid] = msgspec.field(default_factory=list)  # the pids GPU events were filed under
    process_names: dict[Pid, str] = msgspec.field(default_factory=dict)
    members: dict = msgspec.field(default_factory=dict)  # small top-level members (distributedInfo, ...)
    event_count: int = 0
    ignored_count: int = 0  # events of a kept category without a usable ts (or not complete 'X')
    skipped_count: int = 0  # events whose fields had unusable types
    fractional_ts: bool = False  # nanosecond resolution (fractional microseconds) seen

    def host_pids(self) -> list[Pid]:
        seen: dict[Pid, None] = {}
        for pid, _tid in self.threads:
            seen.setdefault(pid, None)
        return list(seen)


def _int_or(value: object, default: int) -> int:
    """Device/stream/correlation ids: ints in Kineto, sometimes hex strings ("0x0") in ROCm."""
    if value is None:
        return default
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return int(value)
    try:
        return int(str(value), 0)
    except ValueError:
        return default


class Collector:
    """Feeds batches of RawEvent into a TraceData. One per file; no shared state."""

    def __init__(self, path: str) -> None:
        self.data = TraceData(path=path)
        self._kinds = category_table()
        self._name_ids: dict[str, int] = {}
        self._track_ids: dict[Pid, int] = {}

    def _name_id(self, name: object) -> int:
        key = name if isinstance(name, str) else ("" if name is None else str(name))
        nid = self._name_ids.get(key)
        if nid is None:
            nid = self._name_ids[key] = len(self.data.names)
            self.data.names.append(key)
        return nid

    def add(self, batch: Sequence[RawEvent]) -> None:
        data = self.data
        kinds = self._kinds
        threads = data.threads
        name_ids = self._name_ids
        name_id = self._name_id
        track_ids = self._track_ids
        last_pid = last_tid = object()  # matches no pid
        # Locals, and plain ints rather than IntEnum members: both measurably cheaper per event.
        RUNTIME, ANNOTATION, KERNEL = int(Kind.RUNTIME), int(Kind.ANNOTATION), int(Kind.KERNEL)
        complete, metadata = CompleteEvent, MetadataEvent
        # The batch's values go to lists first, one per column, and into the arrays once at its end
        # (``fromlist``): ``array.append`` costs about four times ``list.append`` per value, and a
        # batch (one slice of the file, a few thousand events) keeps the lists small.
        gpu_columns: tuple[list, ...] = tuple([] for _ in _GPU_COLUMNS)
        g_ts, g_dur, g_name, g_kind, g_device, g_stream, g_corr, g_nbytes, g_track = (c.append for c in gpu_columns)
        host_columns: dict[tuple[Pid, Pid], tuple[list, ...]] = {}
        t_ts = t_dur = t_name = t_kind = t_corr = None
        for ev in batch:
            if type(ev) is not complete:
                if type(ev) is metadata:
                    self._metadata(ev)  # type: ignore[arg-type]
                elif ev.cat in kinds:
                    data.ignored_count += 1
                continue
            kind = kinds.get(ev.cat)
            if kind is None:
                continue
            ts = ev.ts
            if ts is None:
                data.ignored_count += 1
                continue
            dur = ev.dur or 0.0
            if dur < 0.0:
                dur = 0.0
            nid = name_ids.get(ev.name)  # type: ignore[arg-type]
            if nid is None:
                nid = name_id(ev.name)
            args = ev.args
            if kind >= KERNEL:
                g_ts(ts)
                g_dur(dur)
                g_name(nid)
                g_kind(kind)
                track = track_ids.get(ev.pid)
                if track is None:
                    track = track_ids[ev.pid] = len(data.tracks)
                    data.tracks.append(ev.pid)
                g_track(track)
                if args is None:
                    g_device(_int_or(ev.pid, -1))
                    g_stream(_int_or(ev.tid, -1))
                    g_corr(-1)
                    g_nbytes(0)
                else:
                    device = args.device
                    g_device(device if type(device) is int else _int_or(device if device is not None else ev.pid, -1))
                    stream = args.stream
                    g_stream(stream if type(stream) is int else _int_or(stream if stream is not None else ev.tid, -1))
                    corr = args.correlation
                    g_corr(corr if type(corr) is int else _int_or(corr, -1))
                    nbytes = args.bytes
                    g_nbytes(nbytes if type(nbytes) is int else _int_or(nbytes, 0))
                continue
            pid, tid = ev.pid, ev.tid
            if pid != last_pid or tid != last_tid:  # consecutive events mostly share a thread
                last_pid, last_tid = pid, tid
                columns = host_columns.get((pid, tid))
                if columns is None:
                    if (pid, tid) not in threads:  # created in the order threads are first seen
                        threads[(pid, tid)] = HostThread()
                    columns = host_columns[(pid, tid)] = tuple([] for _ in _HOST_COLUMNS)
                t_ts, t_dur, t_name, t_kind, t_corr = (c.append for c in columns)
            t_ts(ts)
            t_dur(dur)
            t_name(nid)
            t_kind(kind)
            if kind == RUNTIME and args is not None:
                corr = args.correlation
                t_corr(corr if type(corr) is int else _int_or(corr, -1))
            else:
                t_corr(-1)
            if kind == ANNOTATION:
                number = step_number(data.names[nid])
                if number is not None:
                    data.steps.append(StepMark(pid, tid, number, ts, dur))  # type: ignore[arg-type]
        _extend(data.gpu, _GPU_COLUMNS, gpu_columns)
        for key, columns in host_columns.items():
            _extend(threads[key], _HOST_COLUMNS, columns)
        data.event_count += len(batch)

    def _metadata(self, ev: MetadataEvent) -> None:
        if ev.name == "process_name" and ev.args is not None and ev.args.name is not None:
            self.data.process_names[ev.pid] = str(ev.args.name)  # type: ignore[index]

    def finish(self, members: dict, skipped: int) -> TraceData:
        return finish(self.data, members, skipped)


def finish(data: TraceData, members: dict, skipped: int) -> TraceData:
    """The collected columns as numpy arrays (the same buffers), and what the stream learnt besides.
    numpy is imported here, not with the module: a reading can start, and fork a second reader
    (halves.py), before numpy loads."""
    import numpy as np

    data.members = members
    data.skipped_count = skipped
    for columns in (data.gpu, *data.threads.values()):
        for name in columns.__struct_fields__:
            value = getattr(columns, name)
            setattr(columns, name, np.frombuffer(value, dtype=value.typecode))  # array's codes are numpy's
    data.fractional_ts = has_fractional_ts(data)
    return data


def has_fractional_ts(data: TraceData) -> bool:
    """Nanosecond resolution: a fractional microsecond among the first timestamps of a column."""
    return _has_fraction(data.gpu.ts) or any(_has_fraction(t.ts) for t in data.threads.values())


_HOST_COLUMNS = ("ts", "dur", "name", "kind", "corr")
_GPU_COLUMNS = ("ts", "dur", "name", "kind", "device", "stream", "corr", "nbytes", "track")


def _extend(columns: HostThread | GpuActivities, names: tuple[str, ...], values: tuple[list, ...]) -> None:
    for name, column in zip(names, values):
        getattr(columns, name).fromlist(column)


def _has_fraction(values: np.ndarray, sample: int = 2000) -> bool:
    import numpy as np

    head = values[:sample]
    return bool(np.any(head != np.trunc(head)))

