"""The flight recorder's rings: a process's recent steps, Python GC pauses and finished requests.

Always on, so three rules shape every line here:

* **Fixed memory.** Each ring is one ``bytearray`` of fixed-size rows, allocated once, plus (requests
  only) one list of id strings. Nothing grows after construction.
* **Nothing the garbage collector tracks, per row.** A row is eight-byte integers packed into the
  bytearray by one ``struct.Struct.pack_into`` call; neither bytearrays nor ints nor str are
  GC-tracked, so a full ring adds no work to any collection (a deque of tuples would add 65,536
  tracked tuples to every full collection).
* **Cheap on the step path.** ``StepRing.begin`` is one clock read and one store;
  ``StepRing.end`` one clock read, one ``pack_into`` of the whole row, two stores. An engine hook
  that reads the clock anyway (a worker's step telemetry) passes its reads, and the probe writes
  the start and the row inline rather than calling ``begin`` and ``end``. Packing a row in
  one call measured about 25 % cheaper than one ``array`` store per column (10 columns), and it
  makes a row write atomic under the GIL: a reader never sees half a row. Measured on the 2-core
  development host (benchmarks/bench_ring.py): ``begin()`` + ``end(...)`` 0.7-0.8 µs with the
  counts passed by position, 0.85-1.0 µs by keyword; two clock reads are 0.12 µs of it, packing
  the row about 0.2 µs.

Row layout: signed 64-bit, native byte order, no padding (``"=Nq"``): a value cannot overflow for any
count or nanosecond time a process meets, so the step path has no check and no ``try``. The caller
passes ints; ``UNKNOWN`` (-1) means "not known in this process".

Memory (rows of 8 bytes per field, ``capacity + 1`` slots, see below):

* ``StepRing``: 10 fields, 80 B a row; 65,536 rows (default) -> 5,242,960 B (5.0 MiB) per
  step-driven process, 10.9 minutes at 100 steps/s. A process with CUDA adds the allocator's bytes
  (``GPU_MEMORY_FIELDS``, read as gpu_memory.py says): 12 fields, 96 B a row, 6,291,552 B (6.0 MiB).
* ``GcPauses``: 5 fields, 40 B a row; 4,096 rows -> 163,880 B (160 KiB) per process; only pauses of
  1 ms or more take a row by default, every pause counts in its totals.
* ``RequestRing``: 6 fields and an id, 48 + 8 B a row; 16,384 rows -> 917,560 B (896 KiB) in the API
  server, plus the id strings it keeps alive (about 100 B each).

Reading while another thread writes (``dump`` runs on the probe's link thread while the step thread
writes). The writer packs row ``written`` into slot ``written % slots`` and only then increments
``written``. The reader reads ``n1 = written``, copies the buffers, reads ``n2 = written``: every row
the writer touched meanwhile, including one it had begun and not counted, has a logical index in
``[n1, n2]`` and overwrote logical row ``index - slots``. So logical rows
``[max(0, n2 - capacity), n1)`` are intact in the copy, provided the ring has ``capacity + 1``
slots: the spare slot is the one a writer may be in the middle of, which is why a quiescent ring
returns exactly its ``capacity`` newest rows. (This relies on the GIL: a copy and a row write are
each one C call.)

All times are ``time.time_ns()`` (Unix, CLOCK_REALTIME): one clock for every ring of every process,
the same the traces of captures use, so the sidecar can put processes side by side.
"""

from __future__ import annotations

import gc
import logging
import os
import struct
from bisect import bisect_left
from threading import get_ident
from time import time_ns
from typing import Any, Callable, Mapping, Optional

from ..common import packed_rows
from ..common.config import ENV_RECORDER_STEPS, env_number
from ..common.recorder_fields import GC_FIELDS, GPU_MEMORY_FIELDS, OUTCOMES, REQUEST_FIELDS, STEP_FIELDS, UNKNOWN_OUTCOME

log = logging.getLogger(__name__)

DEFAULT_STEP_CAPACITY = 65536  # >= 10 min at 100 steps/s
RATE_WINDOW_S = 2.0  # a process's own step rate at "arm" is measured over its last this many seconds
DEFAULT_GC_CAPACITY = 4096
DEFAULT_GC_MIN_PAUSE_NS = 1_000_000  # shorter GC pauses only count in totals (GcPauses)
DEFAULT_REQUEST_CAPACITY = 16384
# SIDECAR_RECORDER_STEPS above this is clamped: 4,194,304 rows are 320 MiB per process (11.6 h at
# 100 steps/s). A typo with three more zeros must not take the engine's memory.
MAX_STEP_CAPACITY = 1 << 22
UNKNOWN = -1
TAIL_MARGIN_ROWS = 256  # an incremental dump copies this many rows more than the ring said it needs

_FIELD_BYTES = 8
_STEP_END = STEP_FIELDS.index("end_ns")
_STEP_HEAD = struct.Struct("=3q")  # a step row's first fields: step, start_ns, end_ns
_REQUEST_FINISHED = REQUEST_FIELDS.index("finished_ns")


class _PackedRows:
    """A fixed ring of rows of ``fields`` int64 values in one bytearray, and the consistent read of it
    (module docstring). Subclasses write rows themselves, inline, to keep the write path flat."""

    __slots__ = ("capacity", "written", "_slots", "_rows", "_row_bytes", "_fields", "_pack")

    def __init__(self, capacity: int, fields: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an integer >= 1, not {capacity!r}")
        self.capacity = capacity
        self.written = 0  # rows ever written; the next row goes to slot written % (capacity + 1)
        self._slots = capacity + 1  # one spare: the slot a writer may be in the middle of
        self._fields = fields
        self._row_bytes = fields * _FIELD_BYTES
        self._rows = bytearray(self._row_bytes * self._slots)
        self._pack = struct.Struct(f"={fields}q").pack_into

    @property
    def memory_bytes(self) -> int:
        """Bytes of the row buffer (fixed at construction)."""
        return len(self._rows)

    def _read(self, side: Optional[list] = None) -> tuple[int, memoryview, Optional[list]]:
        """(rows written when the read began, the intact rows oldest first as one flat int64 view,
        row after row, the matching entries of ``side``: a per-slot list the writer fills before
        packing the row). Safe against one writer on another thread."""
        n1 = self.written
        rows = bytes(self._rows)  # one C call: no row is half-copied
        side_copy = side[:] if side is not None else None
        n2 = self.written
        first = max(0, n2 - self.capacity)
        count = max(0, n1 - first)  # 0: more than a ring's worth was written during the copy
        slots, width = self._slots, self._row_bytes
        lo = first % slots
        hi = lo + count
        view = memoryview(rows)  # slices of it copy nothing; a wrapped ring's two parts are joined in one copy
        if hi <= slots:
            packed = view[lo * width:hi * width]
            side_rows = side_copy[lo:hi] if side_copy is not None else None
        else:  # the rows wrap around the end of the buffer
            packed = memoryview(b"".join((view[lo * width:], view[:(hi - slots) * width])))
            side_rows = side_copy[lo:] + side_copy[:hi - slots] if side_copy is not None else None
        return n1, packed.cast("q"), side_rows

    def _columns(self, flat: memoryview, keys: list[int], since_ns: int,
                 side: Optional[list] = None) -> list[list]:
        """The columns of the rows whose key is >= ``since_ns`` (``side`` first when given):
        ``packed_rows.columns``, the rule the sidecar applies to a packed dump too."""
        return packed_rows.columns(flat, self._fields, keys, since_ns, side)

    def _read_newest(self, newest: int) -> tuple[int, memoryview, bool]:
        """As ``_read`` (no side list) for the ``newest`` rows at most: (rows written when the read
        began, those of them still intact, oldest first, as one flat int64 view, whether they reach
        back to the oldest row the ring holds). Only their slots are copied, in one or two C calls
        (the rows wrap around the end of the buffer): each copies whole rows, and the module
        docstring's argument holds for each, so a row the writer touched meanwhile is left out."""
        n1 = self.written
        slots, width = self._slots, self._row_bytes
        want = max(0, min(newest, self.capacity, n1))
        lo = (n1 - want) % slots
        hi = lo + want
        with memoryview(self._rows) as view:
            if hi <= slots:
                packed = view[lo * width:hi * width].tobytes()
            else:
                packed = view[lo * width:].tobytes() + view[:(hi - slots) * width].tobytes()
        n2 = self.written
        first = max(0, n2 - self.capacity, n1 - want)  # rows before it may be overwritten: left out
        packed = packed[(first - (n1 - want)) * width:]
        return n1, memoryview(packed).cast("q"), first == max(0, n2 - self.capacity)

    def _tail_columns(self, flat: memoryview, keys: memoryview, since_ns: int,
                      whole: bool) -> Optional[list[list]]:
        """The columns of the rows from the first key >= ``since_ns``, found by bisecting the keys'
        strided view: no Python int made but for the rows kept. None when that cannot be told from
        these rows: the cut at their very first row where older rows were not copied (``whole``
        False), or keys around the cut or after it out of order (the wall clock was stepped back
        there); the caller then reads the whole ring. A step back among the older rows alone can hide
        a row from this read; the incremental reader reaches back before its last read
        (service/incidents/recorder_window.py), which had it."""
        lo = bisect_left(keys, since_ns)
        kept = keys[lo:].tolist()
        if (lo == 0 and len(keys) and not whole) or (lo and keys[lo - 1] >= since_ns) \
                or any(a > b for a, b in zip(kept, kept[1:])):
            return None
        fields = self._fields
        return [flat[lo * fields + k::fields].tolist() for k in range(fields)]


class StepRing(_PackedRows):
    """The newest ``capacity`` steps of one step-driven process, written on its step thread.

    ``begin()`` at the start of every engine step, ``end(...)`` at its end; a watchdog on another
    thread reads ``open_since_ns`` to see a step that has not ended."""

    __slots__ = ("open_since_ns", "step_thread_id", "gpu", "fields")

    def __init__(self, capacity: int = DEFAULT_STEP_CAPACITY, gpu: Any = None) -> None:
        """``gpu``: a process with CUDA's ``GpuMemory`` (gpu_memory.py): each row then has the
        allocator's bytes at the step's end too (``GPU_MEMORY_FIELDS``, two more fields)."""
        self.fields = STEP_FIELDS + GPU_MEMORY_FIELDS if gpu is not None else STEP_FIELDS
        super().__init__(capacity, len(self.fields))
        self.gpu = gpu
        # Start of the step begun and not yet ended, else 0. Written on the step thread (the probe
        # writes it inline, a call cheaper than begin()); the watchdog reads it from another thread.
        self.open_since_ns = 0
        # The thread of the first begin(): the engine's step thread (GcPauses uses it).
        self.step_thread_id: Optional[int] = None

    # -- the step path ---------------------------------------------------------------------------
    def begin(self, now_ns: int = 0) -> None:
        """A step starts; ``now_ns``: its start if the caller read the clock already (0: read it)."""
        self.open_since_ns = now_ns or time_ns()
        if self.step_thread_id is None:
            self.step_thread_id = get_ident()

    def end(self, step: int, working: bool, batch: int = UNKNOWN, tokens: int = UNKNOWN,
            prefill_tokens: int = UNKNOWN, decode_tokens: int = UNKNOWN, running: int = UNKNOWN,
            waiting: int = UNKNOWN, now_ns: int = 0) -> None:
        """One finished step, ended at ``now_ns`` (0: now). Without a ``begin()`` since the last
        ``end()`` the row's start is its end. An engine hook that reads the clock for its own
        telemetry passes its reads: two clock reads fewer per step. ``Probe.step_end`` writes the
        same row with these statements inline (one Python call fewer per step): change both together
        (tests/probe/test_probe_ring.py holds them to the same rows)."""
        now = now_ns or time_ns()
        # ``working`` is a bool, which "q" packs as 0 or 1 (bool is an int): no conversion here.
        gpu = self.gpu
        if gpu is None:
            self._pack(self._rows, self.written % self._slots * self._row_bytes, step, self.open_since_ns or now,
                       now, working, batch, tokens, prefill_tokens, decode_tokens, running, waiting)
        else:
            if gpu.at_step_end:
                gpu.read_now()
            self._pack(self._rows, self.written % self._slots * self._row_bytes, step, self.open_since_ns or now,
                       now, working, batch, tokens, prefill_tokens, decode_tokens, running, waiting,
                       gpu.allocated, gpu.reserved)
        self.open_since_ns = 0
        self.written += 1

    # -- other threads -----------------------------------------------------------------------------
    @property
    def open_step(self) -> int:
        """The row index the open step will take (rows written so far), ``UNKNOWN`` when none is open."""
        return self.written if self.open_since_ns else UNKNOWN

    def _rows_since(self, since_ns: int) -> int:
        """How many of the newest rows end at or after ``since_ns``, by bisecting the live rows' ends
        (each read one C call, so whole): a hint for ``_read_newest``, as the writer moves on meanwhile."""
        written = self.written
        lo, hi = max(0, written - self.capacity), written
        slots, width, rows = self._slots, self._row_bytes, self._rows
        while lo < hi:
            mid = (lo + hi) // 2
            if _STEP_HEAD.unpack_from(rows, mid % slots * width)[2] < since_ns:
                lo = mid + 1
            else:
                hi = mid
        return written - lo

    def slowest_since(self, index: int) -> tuple[float | None, int | None, int]:
        """The slowest step that ended since row ``index`` (a count of ``written`` read earlier):
        (its duration in ms, its step number, the ``written`` to pass next time); (None, None, …) when
        no step ended. For the heartbeat (link thread), so that a rule on one slow step sees every
        step, not only the one running at the beat: it unpacks only the new rows, not a whole dump.
        Rows already overwritten (more than ``capacity`` steps since ``index``) are skipped."""
        written = self.written
        first = max(index, written - self.capacity)
        slots, width, rows = self._slots, self._row_bytes, self._rows
        best_ns, best_step = -1, None
        for i in range(first, written):
            step, start, end = _STEP_HEAD.unpack_from(rows, i % slots * width)
            if end - start > best_ns:
                best_ns, best_step = end - start, step
        if best_step is None:
            return None, None, written
        return best_ns / 1e6, best_step, written

    def recent_rate(self, window_s: float = RATE_WINDOW_S, now_ns: int = 0) -> float | None:
        """Working steps per second between the first and the last step that ended in the last
        ``window_s`` (None: fewer than two, or no working step among them). Read at "arm" on the link
        thread: the sidecar's lead needs a rate before its heartbeats measured one (service/arming.py).
        It unpacks those rows only, newest first, and stops at a row that is not older than the one
        after it (the step thread overwrote it meanwhile)."""
        written = self.written
        if written < 2:
            return None
        horizon = (now_ns or time_ns()) - int(window_s * 1e9)
        slots, width, rows = self._slots, self._row_bytes, self._rows
        last_step, _, last_end = _STEP_HEAD.unpack_from(rows, (written - 1) % slots * width)
        first_step, first_end = last_step, last_end
        for i in range(written - 2, max(written - self.capacity, 0) - 1, -1):
            step, _, end = _STEP_HEAD.unpack_from(rows, i % slots * width)
            if end < horizon or end > first_end or step > first_step:
                break
            first_step, first_end = step, end
        if last_end <= first_end or last_step <= first_step:
            return None
        return (last_step - first_step) * 1e9 / (last_end - first_end)

    def dump(self, since_ns: int = 0, *, tail: bool = False, packed: bool = False) -> dict[str, Any]:
        """The ring's rows, oldest first, those ending at or after ``since_ns``, as columns
        (JSON-able). Safe while ``end()`` runs on another thread. ``tail``: the caller asks for the
        few newest rows (an incremental read, Query.since_ns): found by bisection (``_tail_columns``).
        ``packed``: the rows as they are (sidecar/common/packed_rows.py), which the sidecar cuts."""
        if packed:
            return self._packed_dump(since_ns, tail)
        columns = None
        if tail and since_ns > 0:  # the newest rows only: a margin more than the ring says it has
            want = self._rows_since(since_ns) + TAIL_MARGIN_ROWS
            written, flat, whole = self._read_newest(want)
            open_since = self.open_since_ns
            ends = flat[_STEP_END::len(self.fields)]
            columns = self._tail_columns(flat, ends, since_ns, whole)
        if columns is None:
            written, flat, _ = self._read()
            # Read after the rows: a step open now has an index >= written, so it is not among them.
            open_since = self.open_since_ns
            ends = flat[_STEP_END::len(self.fields)]
            columns = self._columns(flat, ends.tolist(), since_ns)
        return self._dump(written, open_since, dict(zip(self.fields, columns)))

    def _packed_dump(self, since_ns: int, tail: bool) -> dict[str, Any]:
        """``dump(packed=True)``: the intact rows, those of a tail read where they reach back to
        ``since_ns`` (their first row ends before it, or they are every row the ring holds), else
        all. No row is unpacked here but the first of a tail."""
        flat = None
        if tail and since_ns > 0:
            written, flat, whole = self._read_newest(self._rows_since(since_ns) + TAIL_MARGIN_ROWS)
            open_since = self.open_since_ns
            if not whole and (not len(flat) or flat[_STEP_END] >= since_ns):
                flat = None
        if flat is None:
            written, flat, _ = self._read()
            open_since = self.open_since_ns  # read after the rows, as in dump()
        return self._dump(written, open_since, packed_rows.pack(flat, self.fields, since_ns))

    def _dump(self, written: int, open_since: int, steps: dict[str, Any]) -> dict[str, Any]:
        dump = {"clock": "unix_ns", "capacity": self.capacity, "written": written,
                "open_since_ns": open_since, "steps": steps}
        if self.gpu is not None:  # how its gpu_* columns were read (gpu_memory.py): step_end, sampled, pending
            dump["gpu_memory_source"] = self.gpu.source
        return dump


class GcPauses(_PackedRows):
    """Python garbage-collection pauses via ``gc.callbacks``: a small ring of (start_ns, duration_ns,
    generation, collected, on_step_thread), and running totals of every collection.

    Only pauses of at least ``min_pause_ns`` take a row. A process that allocates a lot collects its
    young generation thousands of times a second (measured: 3,000/s, median 23 µs each, in a loop
    building dicts), which would push a 4,096-row ring's one 10 ms full collection out within a
    second or two; with the default 1 ms floor the ring holds the pauses that can explain a slow step
    for as long as the step ring holds steps, and the totals (``collections``, ``pause_ns``,
    ``step_thread_pause_ns``) still count every pause.

    The callback runs on whichever thread triggered the collection, at its start and its end: about
    0.6 µs per collection (1.3 µs when it writes a row) on top of the 0.9 µs CPython spends on any
    GC callback, measured on the 2-core development host. It never raises: an exception in a GC callback is printed on every collection, so any error is only
    counted in ``errors``."""

    __slots__ = ("errors", "collections", "pause_ns", "step_thread_pause_ns", "min_pause_ns", "_started_ns",
                 "_step_thread_id", "_callback")

    def __init__(self, capacity: int = DEFAULT_GC_CAPACITY,
                 step_thread_id: Callable[[], Optional[int]] = lambda: None,
                 min_pause_ns: int = DEFAULT_GC_MIN_PAUSE_NS) -> None:
        super().__init__(capacity, len(GC_FIELDS))
        self.min_pause_ns = min_pause_ns
        self.errors = 0
        self.collections = 0  # every collection seen, recorded in a row or not
        self.pause_ns = 0
        self.step_thread_pause_ns = 0
        self._started_ns = 0
        self._step_thread_id = step_thread_id  # e.g. ``lambda: ring.step_thread_id``
        self._callback = self._on_gc  # one bound method, so that uninstall finds what install added

    def install(self) -> None:
        """Add the callback to ``gc.callbacks`` (once, however often called)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        while self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _on_gc(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":  # as little as possible inside the pause's bounds
            self._started_ns = time_ns()
            return
        now = time_ns()
        try:
            start = self._started_ns or now
            duration = now - start
            self._started_ns = 0
            self.collections += 1
            self.pause_ns += duration
            on_step_thread = get_ident() == self._step_thread_id()
            if on_step_thread:
                self.step_thread_pause_ns += duration
            if duration >= self.min_pause_ns:
                self._pack(self._rows, self.written % self._slots * self._row_bytes, start, duration,
                           info.get("generation", UNKNOWN), info.get("collected", UNKNOWN),
                           1 if on_step_thread else 0)
                self.written += 1
        except Exception:  # see the class docstring: never raise from a GC callback
            self.errors += 1

    def dump(self, since_ns: int = 0, *, packed: bool = False) -> dict[str, Any]:
        """Pauses oldest first, those ending at or after ``since_ns``, as columns (JSON-able), and
        the totals since the process started (scalars: ``min_pause_ns``, ``collections``,
        ``pause_ns``, ``step_thread_pause_ns``). ``packed``: the rows as they are under ``"packed"``
        (sidecar/common/packed_rows.py), which the sidecar cuts."""
        totals = {"min_pause_ns": self.min_pause_ns, "collections": self.collections, "pause_ns": self.pause_ns,
                  "step_thread_pause_ns": self.step_thread_pause_ns}
        _, flat, _ = self._read()
        if packed:
            return {"packed": packed_rows.pack(flat, GC_FIELDS, since_ns), **totals}
        fields = len(GC_FIELDS)
        ends = [start + duration for start, duration in zip(flat[0::fields].tolist(), flat[1::fields].tolist())]
        return {**dict(zip(GC_FIELDS, self._columns(flat, ends, since_ns))), **totals}


class RequestRing(_PackedRows):
    """Finished requests as the API server saw them: the newest ``capacity``."""

    __slots__ = ("_ids",)

    def __init__(self, capacity: int = DEFAULT_REQUEST_CAPACITY) -> None:
        super().__init__(capacity, len(REQUEST_FIELDS))
        self._ids: list[str] = [""] * self._slots  # str is not GC-tracked; the list is one object

    @property
    def memory_bytes(self) -> int:
        """Bytes of the row buffer and of the id list's slots (not the id strings themselves)."""
        return len(self._rows) + self._slots * 8

    def add(self, request_id: str, arrived_ns: int, first_token_ns: int, finished_ns: int, outcome: str,
            prompt_tokens: int, output_tokens: int) -> None:
        """One finished request. ``outcome``: one of ``OUTCOMES``, anything else is kept as
        ``"unknown"``; ``first_token_ns`` is ``UNKNOWN`` when no token came."""
        code = OUTCOMES.index(outcome) if outcome in OUTCOMES else UNKNOWN
        slot = self.written % self._slots
        self._ids[slot] = request_id
        self._pack(self._rows, slot * self._row_bytes, arrived_ns, first_token_ns, finished_ns, code,
                   prompt_tokens, output_tokens)
        self.written += 1

    def dump(self, since_ns: int = 0, *, packed: bool = False) -> dict[str, Any]:
        """Requests oldest first, those finished at or after ``since_ns``, as columns (JSON-able).
        ``packed``: the rows as they are, with their ids, under ``"packed"`` (outcomes as their index
        in ``OUTCOMES``; sidecar/common/packed_rows.py), which the sidecar cuts."""
        _, flat, ids = self._read(self._ids)
        if packed:
            return {"packed": packed_rows.pack(flat, REQUEST_FIELDS, since_ns, ids)}
        finished = flat[_REQUEST_FINISHED::len(REQUEST_FIELDS)].tolist()
        dump = dict(zip(("id", *REQUEST_FIELDS), self._columns(flat, finished, since_ns, ids)))
        dump["outcome"] = [OUTCOMES[c] if 0 <= c < len(OUTCOMES) else UNKNOWN_OUTCOME for c in dump["outcome"]]
        return dump


def capacity_from_environment(env: Optional[Mapping[str, str]] = None) -> int:
    """Rows of the step ring from ``SIDECAR_RECORDER_STEPS``: unset, the default; ``0``, no ring
    (returns 0); a bad value, the default with an error logged naming the variable; above
    ``MAX_STEP_CAPACITY``, that maximum with an error logged."""
    source = os.environ if env is None else env
    raw = source.get(ENV_RECORDER_STEPS)
    text = raw.strip() if raw is not None else ""
    if text and text.isascii() and text.isdigit() and int(text) == 0:
        return 0
    value = int(env_number(ENV_RECORDER_STEPS, DEFAULT_STEP_CAPACITY, integer=True, env=source))
    if value > MAX_STEP_CAPACITY:
        log.error("inference-sidecar: %s=%r is more than %d; using %d", ENV_RECORDER_STEPS, raw,
                  MAX_STEP_CAPACITY, MAX_STEP_CAPACITY)
        return MAX_STEP_CAPACITY
    return value
