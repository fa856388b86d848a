"""Every thread's Python stack in this process, read from a thread that is not the one stuck.

Why a module of its own: a hung engine (its step thread blocked inside a forward that never returns)
runs no step hook, so whatever examines it must run on another thread of the engine process: the
probe's link thread (``snapshot``), or a short-lived thread the probe starts for a sampling
(``ThreadSampler``). Both read ``sys._current_frames()``, every thread's current frame taken at one
instant under the GIL, the same source as the capture's stack sampler (sidecar/stacks/sampler.py),
and walk each frame's ``f_back`` chain. A thread needs no cooperation to be read: a thread blocked in
C (a lock, a device wait, a socket) has released the GIL and is read like any other. Nothing here
names an engine or imports torch: it runs in every engine process, whatever the engine.

What a frame is
---------------
``{"function": qualname, "file": co_filename, "line": executing line}``, outermost first: the line
the thread is on (innermost frame) or the call it is in (any other frame), as ``py-spy dump`` shows,
not the function's first line (the capture's flame chart names functions by their first line, since
its slices span a function; a dump points at where each frame stands). A stack deeper than
``MAX_DEPTH`` keeps its innermost ``MAX_DEPTH`` frames (where a thread is stuck is at the inner end)
and says it was cut.

What the reading thread pays, and the others
--------------------------------------------
The walk holds the GIL, so every other Python thread waits for it. Measured on a 2-core development
host (Python 3.11, 20 threads parked 14-36 frames deep): a snapshot takes 0.4-0.8 ms (median), once
per request. A sampling tick takes about 65-100 µs with the step thread alone and 220-380 µs with
every thread, most of it cache misses after the sleep between ticks (the same tick back to back:
15 µs for one 36-frame stack); the sampler thread's CPU per sample, its sleep included, was 60-100
µs and 220-490 µs. So sampling every thread at the default 100 Hz holds the GIL about 2-4% of the
time, at 1000 Hz a third or more: a sampling is a short, explicit debugging request (at most
``MAX_SECONDS``), never always-on. Frames are released right after each walk, so nothing here keeps
a thread's locals alive.

Size
----
An answer travels to the sidecar in one websocket frame of at most 1 MiB, so each answer is bounded
to ``MAX_ANSWER_BYTES`` of JSON, estimated from above while it is built (no encoding to measure it):
a snapshot keeps fewer frames of every thread (the innermost ones) and says ``truncated``; a
sampling keeps its most frequent stacks and drops the rarest, and says ``truncated``.
"""

from __future__ import annotations

import sys
import threading
import time
from operator import attrgetter
from typing import Any, Collection, Optional

MAX_DEPTH = 128
MAX_SECONDS = 60.0  # a sampling is a debugging request: it never runs for long
MIN_HZ, MAX_HZ = 1.0, 1000.0
MAX_ANSWER_BYTES = 900_000  # of JSON: room under the 1 MiB websocket frame for the message around it

# Why a sampling ended before its seconds were up (``stop_reason``); None when it ran them all.
STOPPED = "stopped"
THREAD_EXITED = "thread exited"

# Estimated JSON of everything but the strings and numbers: keys, quotes, braces, commas, generous.
_FRAME_OVERHEAD = 40  # {"function":,"file":,"line":},
_THREAD_OVERHEAD = 120  # {"id":,"native_id":,"name":,"daemon":false,"step_thread":false,"frames":[],"truncated":false},
_STACK_OVERHEAD = 110  # {"thread":,"thread_id":,"step_thread":false,"frames":[],"count":,"truncated":true},
_ANSWER_OVERHEAD = 300  # the top-level keys and their numbers
_NUMBER = 21  # the most characters of an int64 (sign included), for ids, counts, times
_CODE_OF = attrgetter("f_code")
_LASTI_OF = attrgetter("f_lasti")


def _json_len(s: Optional[str]) -> int:
    """An upper bound of ``s`` in UTF-8 JSON, quotes included (what the probe channel writes,
    sidecar/common/protocol_codec.py): a printable ASCII character is itself (``"`` and ``\\`` escaped: two),
    any other at most 6 bytes (1-4 of UTF-8, or a control character's ``\\u00XX``)."""
    if s is None:
        return 4  # null
    if s.isascii() and s.isprintable():
        return len(s) + 2 + s.count('"') + s.count("\\")
    return 6 * len(s) + 2


def _frame_bytes(function: str, filename: str) -> int:
    """A frame's JSON ``{"function", "file", "line"}``, from above."""
    return _FRAME_OVERHEAD + _json_len(function) + _json_len(filename) + _NUMBER


def _qualname(code: Any) -> str:
    return getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+


def _walk(top: Any, max_depth: int) -> tuple[list[Any], bool]:
    """The frames of a stack from ``top``, innermost first, at most ``max_depth``; and whether any
    were left out. A frame whose thread returned from it meanwhile keeps its ``f_back`` (CPython
    links the frame objects when it pops them), so the walk ends normally whatever the thread does."""
    walked: list[Any] = []
    keep = walked.append
    f = top
    for _ in range(max_depth):
        keep(f)
        f = f.f_back
        if f is None:
            return walked, False
    return walked, True


def _describe(thread: Optional[threading.Thread]) -> tuple[Optional[str], Optional[int], Optional[bool]]:
    """(name, native id, daemon) of a thread; all None for one ``threading`` does not know (a thread
    started by C code that never called into ``threading``, or one that ended since)."""
    if thread is None:
        return None, None, None
    return thread.name, getattr(thread, "native_id", None), thread.daemon


# -- one snapshot ---------------------------------------------------------------------------------
def snapshot(step_thread_id: Optional[int] = None, skip_thread_ids: Collection[int] = ()) -> dict:
    """Every thread's Python stack now (module docstring).

    ``step_thread_id``: the engine's step thread (``threading.get_ident()``), flagged and listed
    first; None when the probe has not seen it yet. ``skip_thread_ids``: threads left out (the
    caller's own, the probe's link thread, whose stack says nothing about the engine).

    Returns ``{"taken_ns", "max_depth", "truncated", "threads": [{"id", "native_id", "name",
    "daemon", "step_thread", "truncated", "frames": [{"function", "file", "line"}, ...]}]}``,
    frames outermost first; threads: the step thread first, then by name (threads ``threading``
    does not know, with null name, native id and daemon, last), then by id. ``max_depth``: the most
    frames kept of any thread (``MAX_DEPTH``, less when the byte bound needed fewer); ``truncated``
    (top level): the byte bound cut frames or left threads out; a thread's ``truncated``: it has more
    frames than it shows. Never raises for a thread that ends during the walk.
    """
    taken_ns = time.time_ns()
    skip = frozenset(skip_thread_ids)
    # threading's list first: a thread that ends in between has no frames and is left out; one that
    # starts in between is listed without a name rather than missed.
    known = {t.ident: t for t in threading.enumerate()}
    current = sys._current_frames()
    # id(code) -> (code, qualname, file, its frames' estimated bytes): threads share most code, and
    # the entry holds the code object, so its id cannot be reused during the call.
    codes: dict[int, tuple[Any, str, str, int]] = {}
    listed: list[tuple[dict, list[int]]] = []  # (thread, bytes of its k innermost frames, k = 0..)
    try:
        for ident, top in current.items():
            if ident in skip:
                continue
            walked, cut = _walk(top, MAX_DEPTH)
            frames = []
            inner = [0]
            for f in walked:  # innermost first
                code = f.f_code
                entry = codes.get(id(code))
                if entry is None:
                    function, filename = _qualname(code), code.co_filename
                    entry = codes[id(code)] = (code, function, filename, _frame_bytes(function, filename))
                frames.append({"function": entry[1], "file": entry[2], "line": f.f_lineno or 0})
                inner.append(inner[-1] + entry[3])
            frames.reverse()
            walked = None
            name, native_id, daemon = _describe(known.get(ident))
            listed.append(({"id": ident, "native_id": native_id, "name": name, "daemon": daemon,
                            "step_thread": ident == step_thread_id, "truncated": cut, "frames": frames}, inner))
    finally:
        current = top = walked = f = None  # noqa: F841 - hold no other thread's frame past the walk
    listed.sort(key=lambda entry: (not entry[0]["step_thread"], entry[0]["name"] is None, entry[0]["name"] or "",
                                   entry[0]["id"]))
    threads = [thread for thread, _inner in listed]
    depth, kept, truncated = _fit_snapshot(threads, [inner for _thread, inner in listed])
    for thread in threads[:kept]:
        if len(thread["frames"]) > depth:
            thread["frames"] = thread["frames"][-depth:]
            thread["truncated"] = True
    return {"taken_ns": taken_ns, "max_depth": depth, "truncated": truncated, "threads": threads[:kept]}


def _fit_snapshot(threads: list[dict], inner: list[list[int]]) -> tuple[int, int, bool]:
    """(depth, how many threads) that keep a snapshot's estimated JSON under ``MAX_ANSWER_BYTES``:
    the deepest common depth that fits (inner frames kept: where a thread is stuck); at depth 1, the
    first threads that fit (the step thread comes first). And whether anything was cut.
    ``inner[t][k]``: the estimated bytes of thread t's k innermost frames."""
    base = [_THREAD_OVERHEAD + _json_len(t["name"]) + 3 * _NUMBER for t in threads]

    def size(depth: int) -> int:
        return _ANSWER_OVERHEAD + sum(b + s[min(depth, len(s) - 1)] for b, s in zip(base, inner))

    if size(MAX_DEPTH) <= MAX_ANSWER_BYTES:
        return MAX_DEPTH, len(threads), False
    lo, hi = 1, MAX_DEPTH  # size(hi) is over; find the largest depth in [1, hi) that fits
    if size(lo) <= MAX_ANSWER_BYTES:
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if size(mid) <= MAX_ANSWER_BYTES:
                lo = mid
            else:
                hi = mid
        return lo, len(threads), True
    total, kept = _ANSWER_OVERHEAD, 0
    for b, s in zip(base, inner):
        total += b + s[min(1, len(s) - 1)]
        if total > MAX_ANSWER_BYTES:
            break
        kept += 1
    return 1, kept, True


# -- a short sampling -------------------------------------------------------------------------------
def _check_bounds(seconds: float, hz: float, max_stacks: int) -> None:
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"seconds must be in (0, {MAX_SECONDS:g}], got {seconds}")
    if not MIN_HZ <= hz <= MAX_HZ:
        raise ValueError(f"hz must be in [{MIN_HZ:g}, {MAX_HZ:g}], got {hz}")
    if max_stacks < 1:
        raise ValueError(f"max_stacks must be at least 1, got {max_stacks}")


class ThreadSampler:
    """Samples every thread's stack (or only the step thread's) at hz for seconds, from a thread of
    its own, and folds identical stacks into counts.

    ``run()`` blocks for ``seconds`` (the probe calls it on a short-lived thread of its own, which
    is never sampled; neither are ``skip_thread_ids``, the probe's link thread). ``only_thread_id``:
    sample that thread alone (the step thread: cheaper, and the sampling ends if it exits).
    ``step_thread_id``: the thread flagged ``step_thread`` (default: ``only_thread_id``).
    ``max_stacks``: the most distinct stacks kept (distinct by instruction, before they are folded
    by line); samples of further ones are counted in ``dropped``. ``stop()`` (any thread) ends a
    running sampling within one period. One use.

    A sample keeps, per frame, the code object's id() and ``f_lasti`` (the instruction offset): two
    attribute reads, where ``f_lineno`` decodes the code's line table on every read (measured
    about 4x the cost). Lines are worked out once per distinct (code, offset), after the sampling, from the
    code's own line table (``co_lines``), so a thread that runs on between two reads can never pair
    an offset with another offset's line. The code objects of every stack seen stay referenced until
    then, so an id() cannot be reused meanwhile; frames are never kept.
    """

    def __init__(
        self,
        seconds: float,
        hz: float = 100.0,
        only_thread_id: Optional[int] = None,
        skip_thread_ids: Collection[int] = (),
        max_stacks: int = 5000,
        *,
        step_thread_id: Optional[int] = None,
    ) -> None:
        _check_bounds(seconds, hz, max_stacks)
        self.seconds = float(seconds)
        self.hz = float(hz)
        self.only_thread_id = only_thread_id
        self.step_thread_id = only_thread_id if step_thread_id is None else step_thread_id
        self.skip_thread_ids = frozenset(skip_thread_ids)
        self.max_stacks = max_stacks
        self._stopped = False  # written by stop() (any thread), read once per tick

    def stop(self) -> None:
        """End a running ``run()`` within one period; it returns what it has."""
        self._stopped = True

    def run(self) -> dict:
        """Sample, then return ``{"seconds", "hz", "samples", "max_depth", "frames", "stacks",
        "truncated", "dropped", "missed", "stop_reason"}``.

        ``seconds``: how long it actually sampled; ``samples``: how many ticks read the stacks (each
        reads every sampled thread once, so one thread's counts add up to at most ``samples``);
        ``frames``: ``[{"function", "file", "line"}]``, the frame table, ``line`` the executing line;
        ``stacks``: ``[{"thread" (its name, null if unknown), "thread_id", "step_thread", "frames"
        (indexes into ``frames``, outermost first), "count", "truncated" (only when cut at
        ``max_depth``: true)}]``, most frequent first; ``truncated``: stacks were left out
        (``max_stacks`` or the byte bound), whose samples ``dropped`` counts (one per thread per
        tick); ``missed``: ticks skipped because a sample came late (the GIL or the CPU was busy);
        ``stop_reason``: why it ended early (``STOPPED``, ``THREAD_EXITED``), or None.
        """
        skip = self.skip_thread_ids | {threading.get_ident()}
        only = self.only_thread_id
        max_stacks = self.max_stacks
        period = 1.0 / self.hz
        current_frames = sys._current_frames
        clock = time.perf_counter
        sleep = time.sleep
        walk = _walk
        # (thread, code ids, offsets, cut) -> [count, code objects]: the codes keep the ids unique.
        counts: dict[tuple, list] = {}
        names: dict[int, Optional[str]] = {}  # named when first seen: a thread may end before the answer
        dropped = missed = samples = 0
        stop_reason: Optional[str] = None

        def fold(ident: int, top: Any) -> None:
            nonlocal dropped
            walked, cut = walk(top, MAX_DEPTH)
            key = (ident, tuple(map(id, map(_CODE_OF, walked))), tuple(map(_LASTI_OF, walked)), cut)
            entry = counts.get(key)
            if entry is not None:
                entry[0] += 1
            elif len(counts) < max_stacks:
                counts[key] = [1, list(map(_CODE_OF, walked))]
                if ident not in names:
                    names[ident] = _name_of(ident)
            else:
                dropped += 1

        start = next_t = clock()
        deadline = start + self.seconds
        while True:
            if self._stopped:
                stop_reason = STOPPED
                break
            if only is not None:
                top = current_frames().get(only)
                if top is None:
                    stop_reason = THREAD_EXITED
                    break
                fold(only, top)
            else:
                current = current_frames()
                for ident, top in current.items():
                    if ident not in skip:
                        fold(ident, top)
                current = None
            top = None  # hold no frame while waiting
            samples += 1
            next_t += period
            now = clock()
            if next_t < now:  # late (the GIL or the CPU was busy): skip to the next tick still ahead
                late = int((now - next_t) // period) + 1
                missed += late
                next_t += late * period
            if next_t >= deadline:
                break
            sleep(next_t - now)
        elapsed = clock() - start
        return _fold_result(counts, names, self.step_thread_id, {
            "seconds": round(elapsed, 6), "hz": self.hz, "samples": samples, "max_depth": MAX_DEPTH,
            "dropped": dropped, "missed": missed, "stop_reason": stop_reason,
        })


def _line_at(code: Any, lasti: int) -> int:
    """The line of instruction offset ``lasti`` in ``code`` (what ``f_lineno`` says for it): from
    ``co_lines()``, whose ranges are in the same byte offsets as ``f_lasti``. Before the first
    instruction (``lasti`` < 0) a frame is at its first line; an instruction of no line (the
    compiler's own) is at line 0, as ``snapshot`` writes a null ``f_lineno``."""
    if lasti < 0:
        return code.co_firstlineno
    for lo, hi, line in code.co_lines():
        if lo <= lasti < hi:
            return line or 0
    return 0


def _name_of(ident: int) -> Optional[str]:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return None


def _fold_result(counts: dict, names: dict, step_thread_id: Optional[int], head: dict) -> dict:
    """The sampling's answer from its raw counts: stacks of (code, offset) folded into stacks of
    frames (function, file, line), most frequent first, as many as fit in ``MAX_ANSWER_BYTES``
    (estimated); the frame table holds only the frames those use."""
    frame_ids: dict[tuple[str, str, int], int] = {}
    table: list[tuple[str, str, int]] = []
    lines: dict[tuple[int, int], int] = {}
    folded: dict[tuple[int, tuple[int, ...], bool], int] = {}
    for (ident, code_ids, offsets, cut), (count, codes) in counts.items():
        ids = []
        for code_id, lasti, code in zip(code_ids, offsets, codes):
            line = lines.get((code_id, lasti))
            if line is None:
                line = lines[(code_id, lasti)] = _line_at(code, lasti)
            frame = (_qualname(code), code.co_filename, line)
            fid = frame_ids.get(frame)
            if fid is None:
                fid = frame_ids[frame] = len(table)
                table.append(frame)
            ids.append(fid)
        key = (ident, tuple(ids), cut)
        folded[key] = folded.get(key, 0) + count

    frame_cost = [_frame_bytes(function, filename) for function, filename, _line in table]
    index_len = len(str(len(table))) + 1  # an index and its comma, from above
    total = _ANSWER_OVERHEAD
    remap: dict[int, int] = {}
    frames: list[dict] = []
    stacks: list[dict] = []
    dropped = head["dropped"]
    truncated = dropped > 0
    ordered = sorted(folded.items(), key=lambda kv: -kv[1])  # stable: first seen first among equals
    for n, ((ident, ids, cut), count) in enumerate(ordered):
        name = names.get(ident)
        fresh = [fid for fid in dict.fromkeys(ids) if fid not in remap]
        cost = _STACK_OVERHEAD + _json_len(name) + 2 * _NUMBER + index_len * len(ids)
        cost += sum(frame_cost[fid] for fid in fresh)
        if total + cost > MAX_ANSWER_BYTES:  # this and every rarer stack are left out
            dropped += sum(c for _key, c in ordered[n:])
            truncated = True
            break
        total += cost
        for fid in fresh:
            remap[fid] = len(frames)
            function, filename, line = table[fid]
            frames.append({"function": function, "file": filename, "line": line})
        stack = {"thread": name, "thread_id": ident, "step_thread": ident == step_thread_id,
                 "frames": [remap[fid] for fid in reversed(ids)], "count": count}
        if cut:
            stack["truncated"] = True
        stacks.append(stack)
    return {**head, "frames": frames, "stacks": stacks, "truncated": truncated, "dropped": dropped}


def estimated_bytes(answer: dict) -> int:
    """An upper bound of the JSON size of a ``snapshot()`` or ``ThreadSampler.run()`` answer, by the
    same estimate their byte bound uses (tests compare it with the encoded size)."""
    if "stacks" in answer:
        index_len = len(str(len(answer["frames"]))) + 1
        return (_ANSWER_OVERHEAD
                + sum(_frame_bytes(f["function"], f["file"]) for f in answer["frames"])
                + sum(_STACK_OVERHEAD + _json_len(s["thread"]) + 2 * _NUMBER + index_len * len(s["frames"])
                      for s in answer["stacks"]))
    return _ANSWER_OVERHEAD + sum(
        _THREAD_OVERHEAD + _json_len(t["name"]) + 3 * _NUMBER
        + sum(_frame_bytes(f["function"], f["file"]) for f in t["frames"])
        for t in answer["threads"])
