"""Streaming reader: a trace file in, batches of ``RawEvent`` out, in bounded memory.

Why not ``json.load``: a 500 MB trace becomes several GB of Python dicts. Why not ijson: measured on
the largest shared trace (53 MB of JSON), iterating ``ijson.items`` (yajl2_c) alone takes 0.58 s,
while decoding the same events in slices with a typed msgspec decoder takes 0.14 s and never
builds the keys nobody reads (see docs/analysis.md).

How: the top-level object is walked key by key. Small members (``distributedInfo``,
``displayTimeUnit``, ...) are decoded whole, in whatever order they come. ``traceEvents`` is read in
slices that end at a candidate boundary between two events (``}`` ``,`` ``{``); the slice is decoded
as one JSON array. A candidate inside a string or a nested object cannot decode as a complete array,
so a slice that decodes is a true run of whole events; when one does not, the error position picks
an earlier candidate, and with none left a slow exact path decodes a single event with the standard
library, whose error then names the real problem and its byte offset.

The analyser decodes events into its typed structs (``RawEvent``). The sidecar's merge reads the
same way with ``event_type=Any`` (every key of every event, as ``json.load`` gives them, one run at
a time) and ``msgspec.Raw`` (each event's JSON text, checked but not built: a fast validating pass).
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from typing import Any, BinaryIO, Iterator, NamedTuple, Optional

import msgspec

from .errors import TraceFormatError
from .events import RawEvent

SLICE_BYTES = 1 << 20  # 1 MiB: measured faster and 25 MB lighter than 4 MiB on v100-train-large
_MAX_VALUE_BYTES = 256 << 20  # one event or top-level member larger than this is not a trace
_WS = re.compile(rb"[ \t\r\n]*")
BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_KEY = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_ERROR_BYTE = re.compile(r"\(byte (\d+)\)")
try:  # ISA-L's gunzip: same API and errors as gzip, about twice as fast (measured: 0.055 -> 0.025 s)
    from isal import igzip as _gzip
    from isal.isal_zlib import error as GzipError
except ImportError:  # optional: the standard library does the same job
    _gzip, GzipError = gzip, zlib.error  # type: ignore[misc]
# Top-level members the analyser keeps; others (deviceProperties, ...) are decoded and dropped.
# ``inference_sidecar``: what a capture noted in its trace (its phase ranges: sidecar/common/phases.py).
KEPT_MEMBERS = frozenset({"distributedInfo", "displayTimeUnit", "schemaVersion", "traceName", "baseTimeNanoseconds",
                          "inference_sidecar"})


class TopLevel(msgspec.Struct):
    """What the stream learnt besides events; complete once the event iterator is exhausted."""

    members: dict[str, Any] = msgspec.field(default_factory=dict)
    saw_events: bool = False
    skipped_events: int = 0  # entries of traceEvents whose fields had unusable types
    array_format: bool = False  # the file is the event list (JSON Array Format), not an object
    events_end: int = -1  # offset in the JSON text of the ']' that closed the event list


class Shape(NamedTuple):
    """How entries of traceEvents are decoded: the run decoder, and whether they are the typed
    ``RawEvent`` structs (an entry that is not an object is then an error) or ``Any`` / ``msgspec.Raw``."""

    decoder: msgspec.json.Decoder
    typed: bool
    raw: bool


def shape_for(event_type: Any) -> Shape:
    if event_type is RawEvent:
        return Shape(msgspec.json.Decoder(list[RawEvent], strict=False), True, False)
    if event_type is Any or event_type is msgspec.Raw:
        return Shape(msgspec.json.Decoder(list[event_type]), False, event_type is msgspec.Raw)
    raise ValueError(f"event_type must be RawEvent, Any or msgspec.Raw, not {event_type!r}")


def open_trace(path: str) -> BinaryIO:
    try:
        raw = open(path, "rb")
    except OSError as exc:
        raise TraceFormatError(path, f"cannot open: {exc.strerror or exc}") from None
    if raw.read(2) == b"\x1f\x8b":  # gzip magic: trust the bytes, not the file name
        raw.seek(0)
        return _gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    raw.seek(0)
    return raw


class TextBuffer:
    """A sliding window over the decompressed bytes, with absolute offsets for error messages."""

    def __init__(self, path: str, f: BinaryIO) -> None:
        self.path = path
        self._f = f
        self.buf = bytearray()  # mutable: _fast_slice brackets a run of events in place
        self.pos = 0
        self.base = 0  # absolute offset of buf[0]
        self.eof = False

    def error(self, problem: str, at: Optional[int] = None) -> TraceFormatError:
        where = self.base + (self.pos if at is None else at)
        return TraceFormatError(self.path, f"{problem} (at byte {where} of the JSON text)")

    def more(self, want: Optional[int] = None) -> bool:
        """Append up to ``want`` more bytes, dropping what was consumed. False at end of input."""
        if self.eof:
            return False
        try:
            chunk = self._f.read(want or SLICE_BYTES)
        except EOFError:
            raise self.error("truncated: the gzip stream ends early", len(self.buf)) from None
        except (OSError, zlib.error, GzipError) as exc:
            raise self.error(f"corrupt gzip data ({exc})", len(self.buf)) from None
        if not chunk:
            self.eof = True
            return False
        # Drop what was consumed but the byte before pos, where _fast_slice writes its '['.
        # Deleting from the front of a bytearray moves a start offset rather than the data.
        drop = max(self.pos - 1, 0)
        del self.buf[:drop]
        self.base += drop
        self.pos -= drop
        self.buf += chunk
        return True

    def peek(self) -> Optional[int]:
        """Skip whitespace; the next byte, or None at end of input."""
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()  # type: ignore[union-attr]
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return None

    def expect(self, byte: bytes, what: str) -> None:
        if self.peek() != byte[0]:
            raise self.unexpected(what)
        self.pos += 1

    def unexpected(self, what: str) -> TraceFormatError:
        if self.peek() is None:
            return self.error(f"truncated: the file ends where {what} was expected")
        shown = self.buf[self.pos : self.pos + 20].decode("utf-8", "replace")
        return self.error(f"expected {what}, found {shown!r}")

    def value_end(self, what: str) -> tuple[Any, int]:
        """Decode one JSON value at pos with the standard library (exact, slower); returns the value
        and the index just after it. The text window grows while the value looks incomplete, up to
        ``_MAX_VALUE_BYTES``, so a corrupt byte early in a big file does not pull in the rest."""
        decoder = json.JSONDecoder()
        window = 1 << 16
        if self.peek() is None:
            raise self.error(f"truncated: the file ends where {what} was expected")
        while True:
            text = self.buf[self.pos : self.pos + window].decode("utf-8", "surrogateescape")
            try:
                value, end = decoder.raw_decode(text)
            except RecursionError:
                raise self.error(f"{what} is nested too deeply to read") from None
            except json.JSONDecodeError as exc:
                incomplete = exc.msg.startswith("Unterminated") or exc.pos >= len(text.rstrip())
                if incomplete and window < _MAX_VALUE_BYTES:
                    if self.pos + window < len(self.buf) or self.more(max(SLICE_BYTES, window)):
                        window *= 4
                        continue
                at = self.pos + len(text[: exc.pos].encode("utf-8", "surrogateescape"))
                if incomplete and self.eof:
                    raise self.error(f"truncated: the file ends inside {what}", at) from None
                raise self.error(f"corrupt JSON in {what}: {exc.msg}", at) from None
            if end == len(text) and window < _MAX_VALUE_BYTES:
                # The value runs to the end of the text at hand: a number may go on in bytes not read yet.
                if self.pos + window < len(self.buf) or self.more(max(SLICE_BYTES, window)):
                    window *= 4
                    continue
            return value, self.pos + len(text[:end].encode("utf-8", "surrogateescape"))


def read_events(path: str, top: TopLevel, event_type: Any = RawEvent,
                keep: frozenset[str] = KEPT_MEMBERS) -> Iterator[list]:
    """Yield batches of events from ``path``; fills ``top`` along the way, keeping the top-level
    members named in ``keep``. ``event_type``: ``RawEvent`` (the analyser's structs), ``Any``
    (plain values) or ``msgspec.Raw`` (JSON text). Raises TraceFormatError."""
    shape = shape_for(event_type)
    with open_trace(path) as f:
        yield from read_json_text(TextBuffer(path, f), top, shape, keep)
    if not top.saw_events:
        raise TraceFormatError(path, "no traceEvents array: not a Chrome/Kineto trace")


def read_json_text(buf: TextBuffer, top: TopLevel, shape: Shape, keep: frozenset[str]) -> Iterator[list]:
    """The events of the whole JSON text in ``buf``, from its first byte to its end."""
    first = buf.peek()
    if first is None:
        raise TraceFormatError(buf.path, "empty file")
    if first == ord("["):  # the JSON Array Format: the file is the event list
        buf.pos += 1
        top.saw_events = top.array_format = True
        yield from event_array(buf, top, shape)
    elif first == ord("{"):
        buf.pos += 1
        yield from _object_members(buf, top, shape, keep)
    else:
        raise buf.error(f"not JSON trace data: it starts with {bytes(buf.buf[buf.pos:buf.pos + 16])!r}")
    if buf.peek() is not None:
        raise buf.error("unexpected data after the end of the trace JSON")


def _object_members(buf: TextBuffer, top: TopLevel, shape: Shape, keep: frozenset[str]) -> Iterator[list]:
    if buf.peek() == ord("}"):
        buf.pos += 1
        return
    while True:
        yield from _member(buf, top, shape, keep)
        if object_ends(buf):
            return


def rest_of_object(buf: TextBuffer, top: TopLevel, shape: Shape, keep: frozenset[str]) -> Iterator[list]:
    """The members after one whose value was read, up to the object's '}'."""
    while not object_ends(buf):
        yield from _member(buf, top, shape, keep)


def _member(buf: TextBuffer, top: TopLevel, shape: Shape, keep: frozenset[str]) -> Iterator[list]:
    key = _read_key(buf)
    buf.expect(b":", "':' after a key")
    if key == "traceEvents":
        buf.expect(b"[", "the traceEvents array")
        top.saw_events = True
        yield from event_array(buf, top, shape)
    else:
        value, buf.pos = buf.value_end(f"the top-level member {key!r}")
        if key in keep:
            top.members[key] = value


def object_ends(buf: TextBuffer) -> bool:
    """After a top-level member: True past the object's '}', False past the ',' before the next."""
    nxt = buf.peek()
    buf.pos += 1
    if nxt == ord("}"):
        return True
    if nxt != ord(","):
        buf.pos -= 1
        raise buf.unexpected("',' or '}' in the top-level object")
    return False


def _read_key(buf: TextBuffer) -> str:
    while True:
        if buf.peek() != ord('"'):
            raise buf.unexpected("a member name")
        m = _KEY.match(buf.buf, buf.pos)
        if m is None:
            if buf.more():
                continue
            raise buf.error("truncated: the file ends inside a member name")
        try:
            key = json.loads(m.group())
        except ValueError as exc:  # a bad escape ("\x")
            raise buf.error(f"corrupt JSON in a member name: {exc}") from None
        buf.pos = m.end()
        return key


def event_array(buf: TextBuffer, top: TopLevel, shape: Shape) -> Iterator[list]:
    """Yield the events of an array whose '[' was consumed, up to and including its ']'."""
    if buf.peek() == ord("]"):
        top.events_end = buf.base + buf.pos
        buf.pos += 1
        return
    while True:
        if len(buf.buf) - buf.pos < SLICE_BYTES:
            buf.more()
        batch = _fast_slice(buf, shape, top)
        if batch is not None:
            yield batch
            continue
        event = _one_event(buf, top, shape)
        if event is not None:
            yield [event]
        nxt = buf.peek()
        if nxt == ord(","):
            buf.pos += 1
        elif nxt == ord("]"):
            top.events_end = buf.base + buf.pos
            buf.pos += 1
            return
        else:
            raise buf.unexpected("',' or ']' between events")


def _fast_slice(buf: TextBuffer, shape: Shape, top: TopLevel) -> Optional[list]:
    """Decode the longest run of whole events that ends at a boundary candidate; None when no
    candidate decodes (the slow path then takes a single event)."""
    data, start = buf.buf, buf.pos
    limit = len(data)
    while True:
        cut = _last_boundary(data, start, limit)
        if cut is None:
            return None
        try:
            try:
                batch = _decode_run(data, start, cut, shape)
            except msgspec.ValidationError:
                # Typed: a field of an odd type. Untyped: a number msgspec cannot hold (an integer
                # beyond 64 bits, 1e400), which the exact path reads as the standard library does.
                # The typed decoder stops at the first odd field, before seeing whether the rest of
                # the run is JSON: the lenient decode finds that out, and its error shrinks the run
                # as below (returning None instead made every event of a long odd run decode the
                # whole rest again, quadratic).
                batch = _lenient(b"[" + data[start:cut] + b"]", top) if shape.typed else None
        except RecursionError:  # nested too deeply for the decoder: the exact path says where
            return None
        except msgspec.DecodeError as exc:
            m = _ERROR_BYTE.search(str(exc))
            # The error lies at or after this position, so only an earlier candidate can work.
            error_at = start + (int(m.group(1)) - 1 if m else cut - start)
            limit = min(error_at, cut - 1)  # always an earlier candidate: the search must shrink
            continue
        if batch is None:
            return None
        buf.pos = _WS.match(data, cut).end() + 1  # type: ignore[union-attr]  # past the ','
        return batch


def _decode_run(data: bytearray, start: int, cut: int, shape: Shape) -> list:
    """Decode data[start:cut] as a JSON array without copying it: the byte before it (the ',' or
    '[' before the run) and the byte after it (space or the ',' of the boundary) become '[' and ']'
    for the decode and are put back after. Copying each 1 MiB run into a new bytes object cost
    about 15 ms on the largest shared trace. Error positions count from that '[', as they would
    in a copy with a '[' prepended. ``msgspec.Raw`` values point into the text they were decoded
    from, so that shape decodes a copy: the buffer must stay free to be resized."""
    decoder = shape.decoder
    if start == 0 or shape.raw:  # no byte before the run (never once the array's '[' is read): copy
        return decoder.decode(b"[" + data[start:cut] + b"]")
    before, after = data[start - 1], data[cut]
    data[start - 1], data[cut] = 0x5B, 0x5D  # '[' and ']'
    view = memoryview(data)
    try:
        with view[start - 1 : cut + 1] as run:
            return decoder.decode(run)
    finally:
        view.release()  # before anything resizes the bytearray
        data[start - 1], data[cut] = before, after


def _last_boundary(data: bytes, start: int, limit: int) -> Optional[int]:
    """Index just after the '}' of the last `}` `,` `{` boundary candidate that starts before
    ``limit``; None if there is none."""
    k = limit
    while True:
        k = data.rfind(b"}", start, k)
        if k < 0:
            return None
        if BOUNDARY.match(data, k):
            return k + 1


def _lenient(piece: bytes, top: TopLevel) -> Optional[list[RawEvent]]:
    """A slice whose JSON is fine but some field has an odd type (``"ts": "12.5"`` is already
    accepted): convert event by event and skip the ones that cannot be used. None when an entry is
    not an object at all, or holds a number msgspec cannot, so the exact path reports or reads it.
    Raises msgspec.DecodeError where the piece is not JSON (the caller shrinks the run)."""
    try:
        items = msgspec.json.decode(piece)
    except msgspec.ValidationError:
        return None
    if not all(isinstance(item, dict) for item in items):
        return None
    batch: list[RawEvent] = []
    for item in items:
        converted = _convert(item, top)
        if converted is not None:
            batch.append(converted)
    return batch


def _convert(item: dict, top: TopLevel) -> Optional[RawEvent]:
    try:
        return msgspec.convert(item, RawEvent, strict=False)  # type: ignore[arg-type]
    except msgspec.ValidationError:
        top.skipped_events += 1
        return None


def _one_event(buf: TextBuffer, top: TopLevel, shape: Shape) -> Any:
    """The exact path: one event with the standard library, which also reports real errors."""
    if buf.peek() is None:
        raise buf.error("truncated: the file ends inside traceEvents")
    start = buf.pos
    value, end = buf.value_end("an event of traceEvents")
    if not shape.typed:
        buf.pos = end
        return msgspec.Raw(bytes(buf.buf[start:end])) if shape.raw else value
    if not isinstance(value, dict):
        raise buf.error("traceEvents holds an entry that is not an object: not a Chrome/Kineto trace", start)
    buf.pos = end
    return _convert(value, top)
