"""Keep only what the analyses need, in numpy columns, while events stream past.

Per host thread: ts, dur, name id, kind and correlation of every CPU op, annotation, Python frame
and runtime call (29 bytes each). Per GPU activity: ts, dur, name id, kind, device, stream,
correlation, bytes and track (about 50 bytes each). Names are interned to integer ids. Flow arrows,
instant events, counters, GPU-side annotations and everything in ``args`` beyond those few fields
are dropped as they are read, so memory grows with the number of useful events, not with the file.

Why columns built a batch at a time: one Python step per event (216k on the largest shared trace)
cost more than everything else together. Each decoded batch is now turned into columns with
C-level ``map``/``attrgetter`` passes and numpy masks; Python-level work is left for what is rare
(metadata, step annotations, ids that are not plain ints).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import attrgetter
from typing import Hashable, Optional, Sequence

import numpy as np

from .events import Kind, RawEvent, category_table, step_number

Pid = Hashable  # an int in Kineto traces; merged or hand-made traces may use strings

_CAT, _PH, _TS, _DUR = attrgetter("cat"), attrgetter("ph"), attrgetter("ts"), attrgetter("dur")
_NAME, _PID, _TID, _ARGS = attrgetter("name"), attrgetter("pid"), attrgetter("tid"), attrgetter("args")
_DEVICE, _STREAM, _CORR, _BYTES = attrgetter("device"), attrgetter("stream"), attrgetter("correlation"), attrgetter("bytes")
_PH_CODE = {"X": 0, "M": 1}  # anything else: 2


@dataclass
class HostThread:
    """Host events of one (pid, tid), in file order (not necessarily sorted by ts)."""

    ts: np.ndarray
    dur: np.ndarray
    name: np.ndarray  # int32 name ids
    kind: np.ndarray  # int8 Kind
    corr: np.ndarray  # int64, -1 when the event has none


@dataclass
class GpuActivities:
    """Kernels, memcpys and memsets, in file order."""

    ts: np.ndarray
    dur: np.ndarray
    name: np.ndarray
    kind: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    nbytes: np.ndarray
    track: np.ndarray  # index into TraceData.tracks

    def __len__(self) -> int:
        return len(self.ts)


@dataclass(frozen=True)
class StepMark:
    """One ``ProfilerStep#n`` range on the host."""

    pid: Pid
    tid: Pid
    number: int
    ts: float
    dur: float


@dataclass
class TraceData:
    """Everything kept from one trace file."""

    path: str
    names: list[str] = field(default_factory=list)
    threads: dict[tuple[Pid, Pid], HostThread] = field(default_factory=dict)
    gpu: Optional[GpuActivities] = None
    steps: list[StepMark] = field(default_factory=list)
    tracks: list[Pid] = field(default_factory=list)  # the pids GPU events were filed under
    process_names: dict[Pid, str] = field(default_factory=dict)
    members: dict = field(default_factory=dict)  # small top-level members (distributedInfo, ...)
    event_count: int = 0
    ignored_count: int = 0  # events of a kept category without a usable ts (or not complete 'X')
    skipped_count: int = 0  # events whose fields had unusable types
    fractional_ts: bool = False  # nanosecond resolution (fractional microseconds) seen


def _int_or(value: object, default: int) -> int:
    """Device/stream/correlation ids: ints in Kineto, sometimes hex strings ("0x0") in ROCm."""
    if value is None:
        return default
    if isinstance(value, (bool, int, float)):
        return int(value)
    try:
        return int(str(value), 0)
    except ValueError:
        return default


def _ints(values: list, fallback: Optional[list], default: int) -> np.ndarray:
    """int64 column of ids; a missing value takes ``fallback``'s (or ``default``). Plain ints, the
    Kineto case, convert in C; anything else goes through ``_int_or`` one by one."""
    if set(map(type, values)) <= {int}:
        return np.array(values, dtype=np.int64)
    if fallback is None:
        return np.array([_int_or(v, default) for v in values], dtype=np.int64)
    return np.array([_int_or(v if v is not None else f, default) for v, f in zip(values, fallback)], dtype=np.int64)


class Collector:
    """Feeds batches of RawEvent into a TraceData. One per file; no shared state."""

    def __init__(self, path: str) -> None:
        self.data = TraceData(path=path)
        self._kinds = category_table()
        self._name_ids: dict[str, int] = {}
        self._thread_ids: dict[tuple, int] = {}
        self._track_ids: dict[Pid, int] = {}
        self._host: list[tuple] = []  # per batch: (thread id, ts, dur, name, kind, corr)
        self._gpu: list[tuple] = []

    def _intern(self, values: list, table: dict, on_new) -> np.ndarray:
        """Ids for ``values``: one C-level lookup pass; values not seen before (rare after the
        first batches) are numbered in order of first appearance, so every later "first seen"
        order matches the file's."""
        ids = np.fromiter(map(table.get, values, repeat(-1)), dtype=np.int32, count=len(values))
        missing = np.flatnonzero(ids < 0)
        if len(missing):
            for i in missing.tolist():
                value = values[i]
                found = table.get(value)
                if found is None:
                    found = table[value] = on_new(value)
                ids[i] = found
        return ids

    def _name_column(self, names: list) -> np.ndarray:
        if not set(map(type, names)) <= {str}:  # 12345 and "12345" must share one id
            names = [n if type(n) is str else ("" if n is None else str(n)) for n in names]

        def new(name: str) -> int:
            self.data.names.append(name)
            return len(self.data.names) - 1

        return self._intern(names, self._name_ids, new)

    def add(self, batch: Sequence[RawEvent]) -> None:
        data = self.data
        n = len(batch)
        data.event_count += n
        if not n:
            return
        kind = np.fromiter(map(self._kinds.get, map(_CAT, batch), repeat(-1)), dtype=np.int8, count=n)
        ph = np.fromiter(map(_PH_CODE.get, map(_PH, batch), repeat(2)), dtype=np.int8, count=n)
        meta = (kind < 0) & (ph == 1)
        if meta.any():
            for ev in compress(batch, meta.tolist()):
                if ev.name == "process_name" and ev.args is not None and ev.args.name is not None:
                    data.process_names[ev.pid] = str(ev.args.name)  # type: ignore[index]
        ts = np.array(list(map(_TS, batch)), dtype=np.float64)  # None -> nan
        kept = kind >= 0
        good = kept & (ph == 0) & ~np.isnan(ts)
        data.ignored_count += int(np.count_nonzero(kept)) - int(np.count_nonzero(good))
        if not good.any():
            return
        events = list(compress(batch, good.tolist()))
        kind, ts = kind[good], ts[good]
        dur = np.array(list(map(_DUR, events)), dtype=np.float64)
        dur = np.where(dur > 0.0, dur, 0.0)  # missing or negative: 0 (nan > 0 is False)
        name = self._name_column(list(map(_NAME, events)))
        on_gpu = kind >= Kind.KERNEL
        if on_gpu.any():
            self._add_gpu([e for e, g in zip(events, on_gpu.tolist()) if g], ts[on_gpu], dur[on_gpu], name[on_gpu], kind[on_gpu])
        host = ~on_gpu
        if host.any():
            self._add_host([e for e, h in zip(events, host.tolist()) if h], ts[host], dur[host], name[host], kind[host])

    def _add_host(self, events: list, ts, dur, name, kind) -> None:
        keys = list(zip(map(_PID, events), map(_TID, events)))
        thread = self._intern(keys, self._thread_ids, lambda key: len(self._thread_ids))
        corr = np.full(len(events), -1, dtype=np.int64)
        runtime = np.flatnonzero(kind == Kind.RUNTIME)
        if len(runtime):
            args = [events[i].args for i in runtime.tolist()]
            corr[runtime] = _ints([a.correlation if a is not None else None for a in args], None, -1)
        for i in np.flatnonzero(kind == Kind.ANNOTATION).tolist():
            number = step_number(self.data.names[name[i]])
            if number is not None:
                self.data.steps.append(StepMark(keys[i][0], keys[i][1], number, float(ts[i]), float(dur[i])))
        self._host.append((thread, ts, dur, name, kind, corr))

    def _add_gpu(self, events: list, ts, dur, name, kind) -> None:
        pids = list(map(_PID, events))
        data = self.data

        def new_track(pid: Pid) -> int:
            data.tracks.append(pid)
            return len(data.tracks) - 1

        track = self._intern(pids, self._track_ids, new_track)
        args = list(map(_ARGS, events))
        if None in args:  # an activity without args: its pid/tid stand for device/stream
            tids = list(map(_TID, events))
            device = _ints([a.device if a is not None else None for a in args], pids, -1)
            stream = _ints([a.stream if a is not None else None for a in args], tids, -1)
            corr = _ints([a.correlation if a is not None else None for a in args], None, -1)
            nbytes = _ints([a.bytes if a is not None else None for a in args], None, 0)
        else:
            devices, streams = list(map(_DEVICE, args)), list(map(_STREAM, args))
            device = _ints(devices, pids if None in devices else None, -1)
            stream = _ints(streams, list(map(_TID, events)) if None in streams else None, -1)
            corr = _ints(list(map(_CORR, args)), None, -1)
            nbytes = _ints(list(map(_BYTES, args)), None, 0)
        self._gpu.append((ts, dur, name, kind, device, stream, corr, nbytes, track))

    def _release(self, attr: str) -> list:
        parts = getattr(self, attr)
        setattr(self, attr, [])
        return parts

    def finish(self, members: dict, skipped: int) -> TraceData:
        data = self.data
        data.members = members
        data.skipped_count = skipped
        data.gpu = _gpu_columns(self._release("_gpu"))
        # Handed over with no other reference, so each batch's piece is freed once merged.
        data.threads = _split_threads(self._release("_host"), list(self._thread_ids))
        data.fractional_ts = _has_fraction(data.gpu.ts) or any(_has_fraction(t.ts) for t in data.threads.values())
        return data


_GPU_TYPES = (np.float64, np.float64, np.int32, np.int8, np.int64, np.int64, np.int64, np.int64, np.int32)


def _gpu_columns(parts: list[tuple]) -> GpuActivities:
    columns = [np.concatenate([p[c] for p in parts]) if parts else np.zeros(0, dtype=t) for c, t in enumerate(_GPU_TYPES)]
    return GpuActivities(*columns)


def _split_threads(parts: list[tuple], keys: list[tuple]) -> dict[tuple[Pid, Pid], HostThread]:
    """One HostThread per (pid, tid), in order of first appearance, events in file order."""
    if not parts:
        return {}
    parts = [list(p) for p in parts]  # the caller's list of tuples is already let go
    thread = np.concatenate([p[0] for p in parts])
    order = np.argsort(thread, kind="stable")
    bounds = np.cumsum(np.bincount(thread, minlength=len(keys))).tolist()
    del thread
    columns: list[list[np.ndarray]] = [[] for _ in keys]
    for c in range(1, 6):  # a column at a time, each batch's piece dropped once merged: bounded peak
        merged = np.concatenate([p[c] for p in parts])
        for p in parts:
            p[c] = None
        lo = 0
        for t, hi in enumerate(bounds):
            columns[t].append(merged[order[lo:hi]])
            lo = hi
        del merged
    return {key: HostThread(*cols) for key, cols in zip(keys, columns)}


def _has_fraction(values: np.ndarray, sample: int = 2000) -> bool:
    head = values[:sample]
    return bool(np.any(head != np.trunc(head)))
