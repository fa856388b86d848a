"""A flight-recorder ring's rows as they travel packed, and as columns again.

A ring (sidecar/probe/flight_ring.py) holds rows of int64 values in one buffer. A JSON dump turns each
value into a Python int and then into text on a thread of the engine's process, which holds its GIL
for most of that work, while the engine's step thread waits for it again and again: for full rings,
465 ms of the dump thread and a step thread kept waiting up to 97 ms, against 15 ms and 6.5 ms packed
(benchmarks/bench_recorder_dump.py, docs/benchmarks.md). A packed dump sends
the intact rows as the bytes the ring holds instead: the probe copies a buffer and writes it (one
``msgspec.msgpack`` encoding, a copy), and the sidecar, in its own process, makes the columns and
cuts them to the window the query asked for, by the same rule the probe's JSON dump applies
(``columns``).

A packed ring is ``{"fields": [...], "byteorder": "little"|"big", "rows": <bytes>, "since_ns": n}``
(plus ``"ids"``, one per row, for the request ring); the rows may reach before ``since_ns``, the
columns made from them do not. The sidecar reads what a probe wrote as untrusted: anything but that
shape is a ``ValueError`` naming the problem.
"""

from __future__ import annotations

import sys
from array import array
from bisect import bisect_left
from typing import Any, Optional, Sequence

from .recorder_fields import OUTCOMES, UNKNOWN_OUTCOME

FIELD_BYTES = 8
PACKED_FORMAT = 1  # a dump's "packed" member: its rings carry packed rows (this module)


def columns(flat: memoryview, fields: int, keys: list[int], since_ns: int,
            side: Optional[list] = None) -> list[list]:
    """The columns of the rows of ``flat`` (row after row of ``fields`` values) whose key is at or
    after ``since_ns`` (``side``, one entry per row, first when given). Rows are in write order, which
    is clock order unless the wall clock was stepped back: then every key is tested. Only the kept
    rows become Python ints (a strided view's ``tolist``, in C)."""
    picks: Optional[list[int]] = None
    lo, hi = 0, len(keys)
    if since_ns > 0 and keys == sorted(keys):  # the usual case, found in C: a bisection
        lo = bisect_left(keys, since_ns)
    elif since_ns > 0:
        keep = [j for j, value in enumerate(keys) if value >= since_ns]
        if not keep:
            hi = 0
        elif keep[-1] - keep[0] + 1 == len(keep):  # the usual case: a tail
            lo, hi = keep[0], keep[-1] + 1
        else:
            picks = keep
    if picks is None:
        made = [_strided(flat, lo * fields + k, hi * fields, fields) for k in range(fields)]
        return [list(side[lo:hi]), *made] if side is not None else made
    whole = [_strided(flat, k, len(flat), fields) for k in range(fields)]
    return [[column[j] for j in picks] for column in ([list(side)] if side is not None else []) + whole]


def _strided(flat: memoryview, start: int, stop: int, step: int) -> list[int]:
    return flat[start:stop:step].tolist()


def pack(flat: memoryview, fields: Sequence[str], since_ns: int, ids: Optional[list] = None) -> dict[str, Any]:
    """A ring's intact rows (``flat``: int64 values, row after row) as they travel: no value is
    turned into a Python object here."""
    packed: dict[str, Any] = {"fields": list(fields), "byteorder": sys.byteorder, "rows": flat,
                              "since_ns": since_ns}
    if ids is not None:
        packed["ids"] = ids
    return packed


def unpack(packed: Any, key: str, *, ids: bool = False) -> dict[str, list]:
    """The columns (name -> values; ``"id"`` first with ``ids``) of a packed ring's rows whose ``key``
    column is at or after its ``since_ns``. ``key`` may be ``"end_ns"`` of a GC pause: its start plus
    its duration. ValueError when ``packed`` is not what ``pack`` makes."""
    if not isinstance(packed, dict):
        raise ValueError("a packed ring is not a map")
    fields, rows, since = packed.get("fields"), packed.get("rows"), packed.get("since_ns", 0)
    if not isinstance(fields, list) or not fields or not all(isinstance(f, str) for f in fields) \
            or len(set(fields)) != len(fields):
        raise ValueError("a packed ring's fields are not distinct names")
    if not isinstance(rows, (bytes, bytearray)) or len(rows) % (FIELD_BYTES * len(fields)):
        raise ValueError(f"a packed ring's rows are not whole rows of {len(fields)} int64 values")
    if isinstance(since, bool) or not isinstance(since, int) or since < 0:
        raise ValueError("a packed ring's since_ns is not a time")
    values = array("q")
    values.frombytes(rows)
    if packed.get("byteorder", sys.byteorder) != sys.byteorder:
        if packed.get("byteorder") not in ("little", "big"):
            raise ValueError("a packed ring's byteorder is neither little nor big")
        values.byteswap()
    count = len(values) // len(fields)
    side = None
    if ids:
        side = packed.get("ids")
        if not isinstance(side, list) or len(side) != count or not all(isinstance(i, str) for i in side):
            raise ValueError("a packed ring's ids are not one string per row")
    flat = memoryview(values)
    if key == "end_ns" and "end_ns" not in fields and {"start_ns", "duration_ns"} <= set(fields):
        starts = _strided(flat, fields.index("start_ns"), len(flat), len(fields))
        durations = _strided(flat, fields.index("duration_ns"), len(flat), len(fields))
        keys = [s + d for s, d in zip(starts, durations)]
    elif key in fields:
        keys = _strided(flat, fields.index(key), len(flat), len(fields))
    else:
        raise ValueError(f"a packed ring has no {key} column")
    names = (["id"] if ids else []) + fields
    return dict(zip(names, columns(flat, len(fields), keys, since, side)))


def unpack_dump(dump: Any) -> dict[str, Any]:
    """A packed recorder dump (``Probe.recorder_dump(packed=True)``, decoded from msgpack) as the JSON
    dump of the same query: each ring's columns cut to its ``since_ns``, request outcomes by name.
    ValueError when it is not one."""
    if not isinstance(dump, dict) or dump.get("packed") != PACKED_FORMAT:
        raise ValueError("not a packed recorder dump of a known format")
    out = {k: v for k, v in dump.items() if k != "packed"}
    steps = dump.get("steps")
    if steps is not None:
        if not isinstance(steps, dict):
            raise ValueError("a packed dump's steps are not a map")
        out["steps"] = {**steps, "steps": unpack(steps.get("steps"), "end_ns")}
    gc = dump.get("gc")
    if gc is not None:
        if not isinstance(gc, dict):
            raise ValueError("a packed dump's gc is not a map")
        out["gc"] = {**unpack(gc.get("packed"), "end_ns"), **{k: v for k, v in gc.items() if k != "packed"}}
    requests = dump.get("requests")
    if requests is not None:
        if not isinstance(requests, dict):
            raise ValueError("a packed dump's requests are not a map")
        columns = unpack(requests.get("packed"), "finished_ns", ids=True)
        if "outcome" in columns:
            columns["outcome"] = [OUTCOMES[c] if 0 <= c < len(OUTCOMES) else UNKNOWN_OUTCOME
                                  for c in columns["outcome"]]
        out["requests"] = columns
    return out
