"""A large trace file read by two processes at once: a forked child reads the head, this process the
tail (``stream_parts.py`` says where the cut lies and why a bad cut cannot go unnoticed).

``sidecar analyze`` of one large file spends most of its time decoding JSON and collecting events,
one core's work, while the host has another (docs/benchmarks.md has the figures). So
``start_head`` forks a reader of the file's first ``HEAD_SHARE`` of text as early as it can,
before numpy loads (a smaller process to fork); ``load`` then reads the rest here, takes the
child's columns back pickled through a pipe and joins the two into the ``TraceData`` a reading in
one go gives, name for name, event for event, in file order.

Any doubt falls back to that reading in one go, which also gives the error the file deserves: a
head that is not whole events (the cut fell inside a string or nested value), a child that failed
or died, two different cuts. A tail's TraceFormatError stands once the head is known to be whole
(nothing before it failed). Not used with one core, without ``os.fork``, or where another thread
runs (the reasons are ``diff/pair.py``'s), nor for files under ``MIN_TEXT_BYTES``, whose reading is
quicker than a fork pays for.
"""

from __future__ import annotations

import os
import pickle
import stat
import struct
from array import array
from typing import Any, BinaryIO, Optional

from .collect import Collector, GpuActivities, HostThread, TraceData, has_fractional_ts
from .errors import TraceFormatError
from . import forked
from .forked import spare_core
from .stream import TopLevel
from .stream_parts import Cut, head_events, head_is_whole, tail_events

# The head's share of the JSON text. This process also skips the head's text and imports numpy while
# the child reads, and yet half is quickest: whole command, v100-train-large, 10 runs each alternating,
# best 407 ms at 0.5 against 423 (0.45), 431 (0.55), 469 (0.6) and 490 in one go (docs/benchmarks.md).
HEAD_SHARE = 0.5
MIN_TEXT_BYTES = 16 << 20

# What the child sends back: the cut it read to, what its stream learnt, its columns.
HeadPart = tuple[Cut, TopLevel, TraceData]


class Head:
    """The forked reader of one file's head. ``outcome`` once; ``cancel`` always (idempotent)."""

    def __init__(self, path: str, split: int, child: forked.Child) -> None:
        self.path = path  # absolute
        self.split = split
        self._child = child

    def outcome(self) -> Optional[HeadPart]:
        """The child's part, its columns numpy arrays; None when it is of no use (see the module's text)."""
        try:
            return self._child.receive(_receive)
        except (EOFError, pickle.UnpicklingError, ValueError):  # killed before or while it answered
            return None

    def cancel(self) -> None:
        self._child.cancel()


def start_head(path: str | os.PathLike, *, share: float = HEAD_SHARE,
               min_text_bytes: int = MIN_TEXT_BYTES) -> Optional[Head]:
    """Fork the reader of ``path``'s head; None where reading in one go is better or the only way."""
    if not spare_core():
        return None
    size = _text_size(path)
    if size is None or size < min_text_bytes:
        return None
    split = int(size * share)
    child = forked.fork(lambda pipe: _send(pipe, _read_head(os.fspath(path), split)))
    return Head(os.path.abspath(path), split, child) if child is not None else None


def load(path: str, head: Head) -> Optional[TraceData]:
    """The trace read as the head's part and this process's tail; None: read it in one go instead.
    Raises the tail's TraceFormatError when the head was whole."""
    top, cut, collector = TopLevel(), Cut(), Collector(path)
    error: Optional[TraceFormatError] = None
    try:
        try:
            for batch in tail_events(path, top, head.split, cut):
                collector.add(batch)
        except TraceFormatError as exc:
            error = exc
        part = head.outcome()
    finally:
        head.cancel()
    if part is None or cut.at is None or part[0].at != cut.at or _has_nan_ids(part[2]):
        return None
    if error is not None:
        raise error
    _cut, head_top, first = part
    first.members, first.skipped_count = head_top.members, head_top.skipped_events
    return join(first, collector.finish(top.members, top.skipped_events))


def join(first: TraceData, second: TraceData) -> TraceData:
    """``second``'s events after ``first``'s, with ``second``'s name and track ids renumbered into
    ``first``'s (new ones appended in the order they were first seen, as one reading numbers them)."""
    names, name_ids = _renumber(first.names, second.names)
    tracks, track_ids = _renumber(first.tracks, second.tracks)
    threads = dict(first.threads)
    for key, thread in second.threads.items():
        thread = HostThread(ts=thread.ts, dur=thread.dur, name=name_ids[thread.name], kind=thread.kind,
                            corr=thread.corr)
        threads[key] = _concat(threads[key], thread) if key in threads else thread
    g = second.gpu
    gpu = _concat(first.gpu, GpuActivities(ts=g.ts, dur=g.dur, name=name_ids[g.name], kind=g.kind, device=g.device,
                                           stream=g.stream, corr=g.corr, nbytes=g.nbytes, track=track_ids[g.track]))
    data = TraceData(
        path=second.path,  # this process's: the path as a reading in one go names it
        names=names, threads=threads, gpu=gpu, steps=first.steps + second.steps, tracks=tracks,
        process_names={**first.process_names, **second.process_names}, members={**first.members, **second.members},
        event_count=first.event_count + second.event_count,
        ignored_count=first.ignored_count + second.ignored_count,
        skipped_count=first.skipped_count + second.skipped_count)
    data.fractional_ts = has_fractional_ts(data)
    return data


def _has_nan_ids(data: TraceData) -> bool:
    """A NaN pid or tid (the standard library reads ``NaN``) matches only itself, the very object: one
    reading in one go shares that object across the file, while the child's comes back a copy that
    would make its own thread. Rare enough to read such a file in one go."""
    ids = [*data.tracks, *data.process_names, *(value for key in data.threads for value in key)]
    return any(isinstance(value, float) and value != value for value in ids)


def _renumber(first: list, second: list) -> tuple[list, Any]:
    """The values of ``first`` then those of ``second`` not in it; and each of ``second``'s index in that."""
    import numpy as np

    joined = list(first)
    ids = {value: i for i, value in enumerate(first)}
    mapping = np.empty(len(second), dtype=np.int32)
    for i, value in enumerate(second):
        j = ids.get(value)
        if j is None:
            j = ids[value] = len(joined)
            joined.append(value)
        mapping[i] = j
    return joined, mapping


def _concat(a: Any, b: Any) -> Any:
    """Two column structs of one type, ``a``'s rows then ``b``'s."""
    import numpy as np

    return type(a)(**{name: np.concatenate((getattr(a, name), getattr(b, name))) for name in a.__struct_fields__})


def _text_size(path: str | os.PathLike) -> Optional[int]:
    """The size of the JSON text: a gzip file's trailer holds it (modulo 4 GiB, which only moves the
    cut); None when the path is not a readable regular file."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe or device would lose what is read here
            return None
        with open(path, "rb") as f:
            if f.read(2) == b"\x1f\x8b":
                f.seek(-4, os.SEEK_END)
                return struct.unpack("<I", f.read(4))[0]
            return os.fstat(f.fileno()).st_size
    except OSError:
        return None


def _read_head(path: str, split: int) -> Optional[HeadPart]:
    """In the child: the head's part, or None when it is not a run of whole events."""
    try:
        top, cut, collector = TopLevel(), Cut(), Collector(path)
        for batch in head_events(path, top, split, cut):
            collector.add(batch)
    except BaseException:  # a bad text or a bad cut: the reading in one go says which
        return None
    return (cut, top, collector.data) if head_is_whole(top, cut) else None


# The part goes through the pipe as a pickled header, its columns emptied, then each column's bytes:
# pickling the columns would copy each of them once more on both sides (about 5 MB each way on the
# largest shared trace, when the child's peak memory counts against the command's).
_LENGTH = struct.Struct("<Q")


def _columns(data: TraceData) -> list[tuple[Any, str]]:
    return [(columns, name) for columns in (data.gpu, *data.threads.values()) for name in columns.__struct_fields__]


def _send(pipe: BinaryIO, part: Optional[HeadPart]) -> None:
    columns = _columns(part[2]) if part is not None else []
    arrays = [getattr(owner, name) for owner, name in columns]
    for (owner, name), column in zip(columns, arrays):
        setattr(owner, name, array(column.typecode))
    header = pickle.dumps((part, [(a.typecode, len(a)) for a in arrays]), protocol=pickle.HIGHEST_PROTOCOL)
    pipe.write(_LENGTH.pack(len(header)))
    pipe.write(header)
    for column in arrays:
        pipe.write(memoryview(column).cast("B"))


def _receive(pipe: BinaryIO) -> Optional[HeadPart]:
    import numpy as np

    size = pipe.read(_LENGTH.size)
    if len(size) < _LENGTH.size:
        raise EOFError("no header")
    part, shapes = pickle.loads(_read_exactly(pipe, _LENGTH.unpack(size)[0]))
    if part is None:
        return None
    for (owner, name), (typecode, count) in zip(_columns(part[2]), shapes):
        dtype = np.dtype(typecode)
        setattr(owner, name, np.frombuffer(_read_exactly(pipe, count * dtype.itemsize), dtype=dtype))
    return part


def _read_exactly(pipe: BinaryIO, size: int) -> bytearray:
    """``size`` bytes, in a bytearray: numpy arrays over it are writable, as the collector's are."""
    buf = bytearray(size)
    view, done = memoryview(buf), 0
    while done < size:
        got = pipe.readinto(view[done:])
        if not got:
            raise EOFError("the pipe ended early")
        done += got
    view.release()
    return buf
