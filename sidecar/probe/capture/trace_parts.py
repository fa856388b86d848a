"""A process's trace recorded in parts, one torch.profiler session per step, joined into one file.

Why parts: torch.profiler's ``stop()`` turns every recorded op into its event (shapes, FLOPs, memory
records, the Python tracer's calls) on the step thread, holding the GIL throughout, so its time grows
with the events of all the steps it recorded: about 100 ms for 5 steps of vLLM's worker with
``record_shapes`` on a 2-core host, all of it in one step, where a client sees it as one long gap
between two tokens (docs/benchmarks.md, issue 15). Stopped and restarted at each step boundary, each
stop handles one step's events: the same work in all, spread over the steps.

Joining: Kineto writes a trace as a header, ``"traceEvents": [`` and the events, then ``]`` and a
short tail (``"traceName"``); every session of a process writes its timestamps against the same
base (``baseTimeNanoseconds``), so the parts' events concatenate as they are. The join copies bytes
(``os.sendfile``, the GIL released), never parsing the JSON in the engine's process: the first part's
header and tail, every part's events. The sidecar parses the result, as any raw trace, when it merges.
"""

from __future__ import annotations

import json
import os

EVENTS_OPEN = b'"traceEvents": ['
TAIL_KEY = b'"traceName"'
_HEAD_LIMIT = 64 << 20  # a header is kilobytes (a GPU's properties); past this the file is not Kineto's
_TAIL_READ = 64 << 10


def part_path(trace_path: str, k: int) -> str:
    """Where part ``k`` (from 0) of the trace at ``trace_path`` is exported."""
    return f"{trace_path}.part{k}"


def events_span(path: str) -> tuple[int, int, int]:
    """(offset of the first byte after ``"traceEvents": [``, offset of its closing ``]``, file size)
    of a Kineto trace. ValueError when the file does not have that shape."""
    with open(path, "rb") as f:
        head = b""
        while True:
            chunk = f.read(1 << 16)
            if not chunk or len(head) > _HEAD_LIMIT:
                raise ValueError(f"{path}: no {EVENTS_OPEN.decode()} in a Kineto trace")
            scan_from = max(0, len(head) - len(EVENTS_OPEN))
            head += chunk
            at = head.find(EVENTS_OPEN, scan_from)
            if at >= 0:
                start = at + len(EVENTS_OPEN)
                break
        size = os.fstat(f.fileno()).st_size
        tail_at = max(start, size - _TAIL_READ)
        f.seek(tail_at)
        tail = f.read()
    # The last "traceName" is the top-level one: it follows the array (an event's arguments, before
    # it, could hold the same key); the array's "]" is the last one before it.
    key = tail.rfind(TAIL_KEY)
    close = tail.rfind(b"]", 0, key) if key >= 0 else -1
    if close < 0:
        raise ValueError(f"{path}: the trace's event array does not close before its {TAIL_KEY.decode()}")
    return start, tail_at + close, size


def join_parts(parts: list[str], out_path: str) -> int:
    """Write the traces ``parts`` (in step order) as one trace at ``out_path``; return its size. The
    first part's header and tail (its name in the tail becomes ``out_path``'s), every part's events.
    The parts are left in place (the caller deletes them)."""
    spans = [events_span(p) for p in parts]
    first, (_, first_end, first_size) = parts[0], spans[0]
    with open(first, "rb") as f:
        f.seek(first_end)
        tail = f.read(first_size - first_end)
    tail = tail.replace(_json_text(first), _json_text(out_path), 1)
    with open(out_path, "wb") as out:
        _copy(first, 0, first_end, out)
        for path, (start, end, _) in zip(parts[1:], spans[1:]):
            out.write(b",")
            out.flush()
            _copy(path, start, end - start, out)
        out.write(tail)
        out.flush()
        return out.tell()


def _json_text(path: str) -> bytes:
    return json.dumps(path)[1:-1].encode()


def _copy(path: str, offset: int, count: int, out) -> None:
    """``count`` bytes of ``path`` from ``offset`` to the end of ``out`` (flushed), kernel to kernel."""
    out.flush()
    with open(path, "rb") as src:
        while count > 0:
            sent = os.sendfile(out.fileno(), src.fileno(), offset, count)
            if sent == 0:
                raise OSError(f"{path} ended {count} bytes early")
            offset += sent
            count -= sent
    out.seek(0, os.SEEK_END)
