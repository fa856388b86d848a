"""Put events into a plain-JSON Kineto trace file without loading it: the events go first in its
``traceEvents``; the rest of the file is copied as bytes, 1 MiB at a time, so memory does not grow
with the trace. Used to add the stack sampler's slices to a process's exported trace."""

from __future__ import annotations

import json
import os
import re
from typing import Callable, Iterator, Optional


def insert_events(path: str, events_at: Callable[[int], Iterator[dict]], base_time_ns: Optional[int] = None) -> int:
    """Rewrite ``path`` with ``events_at(base)``'s events first in ``traceEvents`` (through a
    temporary file in the same folder, then replaced). ``base``: ``base_time_ns`` when given, else
    the file's ``baseTimeNanoseconds``. Returns the number of events added. Raises ValueError for a
    file that is not a JSON object with a ``traceEvents`` array, OSError for I/O errors; the file is
    left as it was then."""
    with open(path, "rb") as src:
        head, insert_at, empty = _find_events_array(src, path)
        if base_time_ns is None:
            base_time_ns = _find_base_time(src, head, path)
        events = events_at(base_time_ns)
        first = next(events, None)
        if first is None:
            return 0
        tmp = f"{path}.sampled.tmp"
        count = 0
        try:
            with open(tmp, "wb") as dst:
                dst.write(head[:insert_at])
                batch = [_encode(first)]
                count = 1
                sep = b"\n"
                for event in events:
                    batch.append(_encode(event))
                    count += 1
                    if len(batch) >= 2048:
                        dst.write(sep + b",\n".join(batch))
                        batch.clear()
                        sep = b",\n"
                if batch:
                    dst.write(sep + b",\n".join(batch))
                if not empty:
                    dst.write(b",")
                dst.write(head[insert_at:])
                src.seek(len(head))
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    dst.write(chunk)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    return count


_WS = re.compile(rb"[ \t\r\n]*")
_KEY = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BASE_IN_TAIL = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(-?\d+)')
_MAX_HEAD = 64 << 20  # the members before traceEvents (deviceProperties, ...) are small


def _find_events_array(src, path: str) -> tuple[bytes, int, bool]:
    """Read the top-level members up to the '[' of traceEvents. Returns (the bytes read, the index
    just after that '[', whether the array is empty). Members before it are decoded to be skipped,
    so a "traceEvents" text inside them cannot mislead. ``head`` may run past the '['."""
    head = b""
    want = 1 << 16
    while True:
        more = src.read(want - len(head))
        head += more
        eof = not more
        try:
            found = _scan_head(head, eof)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        if found is not None:
            return (head, *found)
        if eof or len(head) >= _MAX_HEAD:
            raise ValueError(f"{path}: no traceEvents array in the first {len(head)} bytes: not a Kineto trace")
        want = len(head) * 4


def _scan_head(head: bytes, eof: bool) -> Optional[tuple[int, bool]]:
    """(index after the '[' of traceEvents, empty array?) or None when more bytes are needed."""
    decoder = json.JSONDecoder()
    pos = _WS.match(head, 0).end()  # type: ignore[union-attr]
    if pos >= len(head):
        return None
    if head[pos:pos + 1] != b"{":
        raise ValueError("not a JSON object (a Kineto trace is one)")
    pos += 1
    while True:
        pos = _WS.match(head, pos).end()  # type: ignore[union-attr]
        if pos >= len(head):
            return None
        if head[pos:pos + 1] == b",":
            pos += 1
            continue
        if head[pos:pos + 1] == b"}":
            raise ValueError("no traceEvents member")
        m = _KEY.match(head, pos)
        if m is None:
            if eof:
                raise ValueError(f"expected a member name at byte {pos}")
            return None
        key = json.loads(m.group())
        pos = _WS.match(head, m.end()).end()  # type: ignore[union-attr]
        if pos >= len(head):
            return None
        if head[pos:pos + 1] != b":":
            raise ValueError(f"expected ':' at byte {pos}")
        pos = _WS.match(head, pos + 1).end()  # type: ignore[union-attr]
        if pos >= len(head):
            return None
        if key == "traceEvents":
            if head[pos:pos + 1] != b"[":
                raise ValueError("traceEvents is not an array")
            after = pos + 1
            nxt = _WS.match(head, after).end()  # type: ignore[union-attr]
            if nxt >= len(head):
                return None
            return after, head[nxt:nxt + 1] == b"]"
        text = head[pos:].decode("utf-8", "surrogateescape")
        try:
            _value, end = decoder.raw_decode(text)
        except json.JSONDecodeError:
            if eof:
                raise ValueError(f"corrupt JSON in the member {key!r}") from None
            return None
        pos += len(text[:end].encode("utf-8", "surrogateescape"))


def _find_base_time(src, head: bytes, path: str) -> int:
    """``baseTimeNanoseconds``: in the members before traceEvents, else in the last MiB of the
    file, else (an odd layout) by reading the whole file with the analyser's streaming reader.
    0 when the trace has none (old Kineto: absolute timestamps)."""
    start = head.find(b'"traceEvents"')
    m = _BASE_IN_TAIL.search(head, 0, start if start >= 0 else len(head))
    if m:
        return int(m.group(1))
    src.seek(0, os.SEEK_END)
    size = src.tell()
    src.seek(max(0, size - (1 << 20)))
    m = _BASE_IN_TAIL.search(src.read())
    if m:
        return int(m.group(1))
    if size > (1 << 20):
        from ..analysis.stream import TopLevel, read_events  # a full pass: rare

        top = TopLevel()
        for _batch in read_events(path, top, keep=frozenset({"baseTimeNanoseconds"})):
            pass
        return int(top.members.get("baseTimeNanoseconds") or 0)
    return 0


def _encode(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode("ascii")  # non-ASCII escaped: always valid
