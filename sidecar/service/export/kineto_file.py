"""Copy a plain-JSON Kineto trace with more events in it, without loading it: the events go first in
its ``traceEvents``; the rest of the file is copied as bytes, 1 MiB at a time, so memory does not
grow with the trace. The merge uses it to add a process's sampled Python stacks
(sidecar/stacks/sampled.py) while it compresses that process's raw trace."""

from __future__ import annotations

import json
import re
import shutil
from typing import BinaryIO, Iterable, Optional

_COPY_CHUNK = 1 << 20
_BATCH = 2048


def copy_with_events(src: BinaryIO, dst: BinaryIO, events: Iterable[dict], name: str = "trace") -> int:
    """Write ``src`` (a Kineto trace, read from its start) to ``dst`` with ``events`` first in its
    ``traceEvents``; returns how many were added. Without events the bytes are copied unchanged.
    Raises ValueError for a trace that is not a JSON object with a ``traceEvents`` array (nothing
    was written to ``dst`` then), OSError for I/O errors; ``name`` names the trace in errors."""
    events = iter(events)
    first = next(events, None)
    if first is None:
        shutil.copyfileobj(src, dst, _COPY_CHUNK)
        return 0
    head, insert_at, empty = _find_events_array(src, name)
    dst.write(head[:insert_at])
    batch = [_encode(first)]
    count = 1
    sep = b"\n"
    for event in events:
        batch.append(_encode(event))
        count += 1
        if len(batch) >= _BATCH:
            dst.write(sep + b",\n".join(batch))
            batch.clear()
            sep = b",\n"
    if batch:
        dst.write(sep + b",\n".join(batch))
    if not empty:
        dst.write(b",")
    dst.write(head[insert_at:])
    shutil.copyfileobj(src, dst, _COPY_CHUNK)
    return count


_WS = re.compile(rb"[ \t\r\n]*")
_KEY = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_MAX_HEAD = 64 << 20  # the members before traceEvents (deviceProperties, ...) are small


def _find_events_array(src: BinaryIO, name: str) -> tuple[bytes, int, bool]:
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
            raise ValueError(f"{name}: {exc}") from None
        if found is not None:
            return (head, *found)
        if eof or len(head) >= _MAX_HEAD:
            raise ValueError(f"{name}: no traceEvents array in the first {len(head)} bytes: not a Kineto trace")
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


def _encode(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode("ascii")  # non-ASCII escaped: always valid
