"""One trace file read as two parts, by two processes at once (``halves.py``): the head up to a cut,
the tail after it.

The cut lies between two events of ``traceEvents``: just after the '}' of the first boundary
candidate (``}`` ``,`` ``{``) whose '}' is at or after a chosen offset of the JSON text. Both
processes find it the same way, reading the decompressed text from its start in the same chunks:
the head passes those bytes on to the decoder and ends them with the brackets that close the event
list and the file ('``]``' or '``]}``'), the tail skips them and decodes from the event after the
cut to the end of the file.

A candidate can also lie inside a string or a nested object, where it is not a boundary between
events. Then the head's text is not JSON whose event list ends at the cut: its reader fails, or the
list it read ends elsewhere (``TopLevel.events_end``). ``head_is_whole`` tells; only a head that
passes it makes the tail's reading valid, and without it both parts are dropped for a reading in
one go (``halves.py``), which gives the answer or the error the file deserves.
"""

from __future__ import annotations

import re
import zlib
from typing import Any, BinaryIO, Iterator, Optional

import msgspec

from .errors import TraceFormatError
from .events import RawEvent
from .stream import (BOUNDARY, KEPT_MEMBERS, SLICE_BYTES, GzipError, TextBuffer, TopLevel, event_array, open_trace,
                     read_json_text, rest_of_object, shape_for)

# What may end a chunk and still be the start of a candidate: a '}', then spaces, perhaps a ','.
_OPEN_CANDIDATE = re.compile(rb"\}[ \t\r\n]*(?:,[ \t\r\n]*)?\Z")
_WS = re.compile(rb"[ \t\r\n]*")


class Cut(msgspec.Struct):
    """Where a reading found the cut (an offset in the JSON text; None: the text ended first)."""

    at: Optional[int] = None
    array_format: bool = False  # the text starts with '[' (the JSON Array Format)


class _Cutter:
    """The text of a trace from its start up to the cut, in pieces, and the bytes read after it."""

    def __init__(self, path: str, f: BinaryIO, split: int, cut: Cut) -> None:
        self._path = path
        self._f = f
        self._split = split
        self.cut = cut
        self.rest = b""  # read past the cut (the tail's first bytes)

    def pieces(self) -> Iterator[bytes]:
        pending = b""  # read, not yet passed on: from a '}' that may start a candidate
        base = 0  # offset of pending[0]
        first = True
        while True:
            try:
                chunk = self._f.read(SLICE_BYTES)
            except (EOFError, OSError, zlib.error, GzipError) as exc:
                # Either part fails here, so the head is not whole: the reading in one go names the problem.
                raise TraceFormatError(self._path, f"unreadable before the cut ({exc})") from None
            if not chunk:
                if pending:
                    yield pending
                return
            if first:
                first = False
                self.cut.array_format = chunk[_WS.match(chunk).end():][:1] == b"["  # type: ignore[union-attr]
            pending += chunk
            start = self._split - base
            if start >= len(pending):  # the cut lies further on
                yield pending
                base += len(pending)
                pending = b""
                continue
            start = max(start, 0)
            found = BOUNDARY.search(pending, start)
            if found is not None:
                at = found.start() + 1
                self.cut.at = base + at
                self.rest = pending[at:]
                yield pending[:at]
                return
            last = pending.rfind(b"}", start)
            keep = last if last >= 0 and _OPEN_CANDIDATE.match(pending, last) else len(pending)
            if keep:
                yield pending[:keep]
            base += keep
            pending = pending[keep:]


class _Pieces:
    """A file-like ``read`` over pieces of text (what TextBuffer reads from)."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces

    def read(self, _size: int = -1) -> bytes:
        return next(self._pieces, b"")


def head_events(path: str, top: TopLevel, split: int, cut: Cut, event_type: Any = RawEvent,
                keep: frozenset[str] = KEPT_MEMBERS) -> Iterator[list]:
    """The events before the cut (and the top-level members before ``traceEvents``), read as the
    text of a whole file that ends at the cut. Check ``head_is_whole`` after."""
    with open_trace(path) as f:
        cutter = _Cutter(path, f, split, cut)

        def text() -> Iterator[bytes]:
            yield from cutter.pieces()
            if cut.at is not None:
                yield b"]" if cut.array_format else b"]}"

        yield from read_json_text(TextBuffer(path, _Pieces(text())), top, shape_for(event_type), keep)  # type: ignore[arg-type]


def head_is_whole(top: TopLevel, cut: Cut) -> bool:
    """The head read up to the cut is a run of whole events of ``traceEvents`` (see the module's text)."""
    return cut.at is not None and top.saw_events and top.events_end == cut.at


def tail_events(path: str, top: TopLevel, split: int, cut: Cut, event_type: Any = RawEvent,
                keep: frozenset[str] = KEPT_MEMBERS) -> Iterator[list]:
    """The events after the cut and the top-level members after ``traceEvents``; nothing when the
    text ends before a cut (``cut.at`` None). Valid only with a head that ``head_is_whole``."""
    with open_trace(path) as f:
        cutter = _Cutter(path, f, split, cut)
        for _skipped in cutter.pieces():
            pass
        if cut.at is None:
            return
        buf = TextBuffer(path, f)
        buf.buf = bytearray(cutter.rest)
        buf.base = cut.at
        buf.expect(b",", "',' after the cut")
        top.saw_events = True
        top.array_format = cut.array_format
        yield from event_array(buf, top, shape_for(event_type))
        if not cut.array_format:
            yield from rest_of_object(buf, top, shape_for(event_type), keep)
        if buf.peek() is not None:
            raise buf.error("unexpected data after the end of the trace JSON")

