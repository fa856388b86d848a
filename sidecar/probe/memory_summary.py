"""A CUDA caching allocator snapshot made into a small JSON summary, in the process that took it.

The input is ``torch.cuda.memory._snapshot()``'s dictionary (torch/cuda/memory.py documents it):
``segments`` (each a cudaMalloc'd segment: ``device``, ``total_size``, ``blocks`` with ``size``,
``state`` "active_allocated" / "active_pending_free" / "inactive" and ``frames``) at the moment of the
snapshot, and ``device_traces``, per device the allocator's history while it was recorded: entries
``{action, addr, size, stream, frames, time_us}``. The summary is computed here, in the probe, so that
the sidecar never unpickles what a probe wrote; the raw snapshot goes to PyTorch's own viewer.

Allocated memory counts a block from its ``alloc`` to its ``free_completed`` (a block freed while
another stream may still use it occupies memory until then), as torch/cuda/_memory_viz.py's trace
does; reserved memory is the segments' total, moved by ``segment_alloc`` / ``segment_free`` (and
``segment_map`` / ``segment_unmap`` of expandable segments). The history is a ring of at most
``max_entries`` entries, so its beginning may be lost: both series are rebuilt backwards from the
snapshot's own state at its end, which is always whole, and ``truncated`` says when the ring was full.

An allocation's site is its first Python frame outside torch's own files (frames come innermost
first): the engine's or the model's line that asked for the memory. Blocks allocated before the
recording began carry no frames of it and are counted under ``BEFORE``.

Pure: no torch, no I/O. Every list is bounded (``TOP_SITES``, ``MAX_POINTS``, one row per step), so
a summary fits in one report on the probe channel whatever the snapshot's size.
"""

from __future__ import annotations

from typing import Any, Iterable

TOP_SITES = 20  # sites listed at the peak; the rest are added up in one row
MAX_POINTS = 400  # points of the allocated / reserved series (each the highest of its stretch)
BEFORE = "(allocated before the recording)"
UNKNOWN = "(no Python frame outside torch)"
ALLOCATED_STATES = ("active_allocated", "active_pending_free")
SEGMENT_GROWS = ("segment_alloc", "segment_map")
SEGMENT_SHRINKS = ("segment_free", "segment_unmap")


def _is_torch_file(filename: str) -> bool:
    path = filename.replace("\\", "/")
    return "/torch/" in path or path.startswith("torch/") or path in ("", "??") or path.startswith("<frozen")


def site_of(frames: Iterable[dict[str, Any]] | None) -> str:
    """``file:line (function)`` of the first frame outside torch (frames innermost first)."""
    for frame in frames or ():
        filename = str(frame.get("filename") or "")
        if not _is_torch_file(filename):
            return f"{filename}:{frame.get('line', 0)} ({frame.get('name', '?')})"
    return UNKNOWN


def _device_trace(snapshot: dict[str, Any], device: int) -> list[dict[str, Any]]:
    traces = snapshot.get("device_traces") or []
    return list(traces[device]) if 0 <= device < len(traces) and traces[device] else []


def _segments(snapshot: dict[str, Any], device: int) -> list[dict[str, Any]]:
    return [s for s in snapshot.get("segments") or [] if int(s.get("device", device)) == device]


def _end_state(segments: list[dict[str, Any]]) -> dict[str, int]:
    reserved = sum(int(s.get("total_size", 0)) for s in segments)
    allocated, free_blocks, largest_free, free_total = 0, 0, 0, 0
    for segment in segments:
        for block in segment.get("blocks") or []:
            size = int(block.get("size", 0))
            if block.get("state") in ALLOCATED_STATES:
                allocated += size
            elif block.get("state") == "inactive":
                free_blocks += 1
                free_total += size
                largest_free = max(largest_free, size)
    return {"allocated_bytes": allocated, "reserved_bytes": reserved, "free_blocks": free_blocks,
            "free_bytes": free_total, "largest_free_block_bytes": largest_free}


def _deltas(entry: dict[str, Any]) -> tuple[int, int]:
    """What one history entry did to (allocated, reserved)."""
    action, size = entry.get("action"), int(entry.get("size", 0) or 0)
    if action == "alloc":
        return size, 0
    if action == "free_completed":
        return -size, 0
    if action in SEGMENT_GROWS:
        return 0, size
    if action in SEGMENT_SHRINKS:
        return 0, -size
    return 0, 0


def _downsample(points: list[tuple[int, int, int]], limit: int) -> list[list[int]]:
    """At most ``limit`` points, each the highest allocated of its stretch (a peak is never smoothed away)."""
    if len(points) <= limit:
        return [list(p) for p in points]
    out, stretch = [], len(points) / limit
    for i in range(limit):
        part = points[int(i * stretch):max(int((i + 1) * stretch), int(i * stretch) + 1)]
        out.append(list(max(part, key=lambda p: (p[1], p[2]))))
    return out


def summarize(snapshot: dict[str, Any], *, device: int = 0, step_ends_us: list[int] | None = None,
              start_us: int | None = None, max_entries: int | None = None, top: int = TOP_SITES,
              max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The summary of ``snapshot`` on ``device``. ``start_us`` and ``step_ends_us``: when recording began
    and when each recorded step ended (unix µs, the history's ``time_us`` clock), which share the
    history out into steps; ``max_entries``: the ring's size, to say whether it was full."""
    trace = _device_trace(snapshot, device)
    end = _end_state(_segments(snapshot, device))
    deltas = [_deltas(e) for e in trace]
    # Backwards from the end, which the segments give whole: the state before the first entry kept.
    allocated = end["allocated_bytes"] - sum(d[0] for d in deltas)
    reserved = end["reserved_bytes"] - sum(d[1] for d in deltas)
    start_time = int(start_us if start_us is not None else (trace[0].get("time_us", 0) if trace else 0))
    start_allocated, start_reserved = allocated, reserved
    # Forwards: the series and the peak (the first time allocated is at its highest).
    points = [(0, allocated, reserved)]
    peak = {"allocated_bytes": allocated, "reserved_bytes": reserved, "entry": -1, "time_us": start_time}
    for index, (entry, (d_alloc, d_reserved)) in enumerate(zip(trace, deltas)):
        allocated += d_alloc
        reserved += d_reserved
        when = int(entry.get("time_us", start_time) or start_time)
        points.append((max(0, when - start_time), allocated, reserved))
        if allocated > peak["allocated_bytes"]:
            peak = {"allocated_bytes": allocated, "reserved_bytes": reserved, "entry": index, "time_us": when}
    ends = list(step_ends_us or [])
    steps = [{"step": i, "allocations": 0, "frees": 0, "allocated_bytes": 0, "reserved_bytes": 0,
              "peak_allocated_bytes": 0} for i in range(len(ends))]
    _share_out(steps, ends, trace, deltas, start_allocated, start_reserved)
    sites = _sites_at(trace, peak["entry"], start_allocated)
    ranked = sorted(sites.items(), key=lambda kv: (-kv[1][0], kv[0]))
    shown = [{"site": site, "bytes": b, "blocks": n} for site, (b, n) in ranked[:top]]
    rest = ranked[top:]
    if rest:
        shown.append({"site": f"({len(rest)} other sites)", "bytes": sum(v[0] for _, v in rest),
                      "blocks": sum(v[1] for _, v in rest)})
    counts = {"alloc": 0, "free_completed": 0, "segment_alloc": 0, "segment_free": 0, "oom": 0}
    for entry in trace:
        action = entry.get("action")
        if action in counts:
            counts[action] += 1
    return {
        "device": device,
        "entries": len(trace),
        "truncated": max_entries is not None and len(trace) >= max_entries,
        "allocations": counts["alloc"],
        "frees": counts["free_completed"],
        "segment_allocs": counts["segment_alloc"],
        "segment_frees": counts["segment_free"],
        "ooms": counts["oom"],
        "start": {"allocated_bytes": start_allocated, "reserved_bytes": start_reserved},
        "end": end,
        "peak": {"allocated_bytes": peak["allocated_bytes"], "reserved_bytes": peak["reserved_bytes"],
                 "at_ms": round(max(0, peak["time_us"] - start_time) / 1000, 3), "entry": peak["entry"],
                 "fragmentation_bytes": peak["reserved_bytes"] - peak["allocated_bytes"], "sites": shown},
        "fragmentation": {"bytes": end["reserved_bytes"] - end["allocated_bytes"],
                          "largest_free_block_bytes": end["largest_free_block_bytes"],
                          "free_blocks": end["free_blocks"]},
        "steps": steps,
        # [ms since recording began, allocated bytes, reserved bytes]
        "series": [[round(t / 1000, 3), a, r] for t, a, r in _downsample(points, max_points)],
    }


def _sites_at(trace: list[dict[str, Any]], upto: int, before: int) -> dict[str, list[int]]:
    """What was live after entry ``upto``, by site: ``{site: [bytes, blocks]}``. The blocks allocated
    in the history are replayed (a site read only for those still live then); ``before`` (allocated
    when the history begins) less what of it was freed makes the row of the blocks without a stack."""
    live: dict[int, tuple[int, Any]] = {}
    for entry in trace[: upto + 1]:
        action = entry.get("action")
        if action == "alloc":
            live[int(entry.get("addr", 0) or 0)] = (int(entry.get("size", 0) or 0), entry.get("frames"))
        elif action == "free_completed":
            if live.pop(int(entry.get("addr", 0) or 0), None) is None:
                before -= int(entry.get("size", 0) or 0)
    sites: dict[str, list[int]] = {}
    for size, frames in live.values():
        row = sites.setdefault(site_of(frames), [0, 0])
        row[0] += size
        row[1] += 1
    if before > 0:
        sites[BEFORE] = [before, 0]
    return sites


def _share_out(steps: list[dict[str, Any]], ends: list[int], trace: list[dict[str, Any]],
               deltas: list[tuple[int, int]], allocated: int, reserved: int) -> None:
    """Each step's entries: those up to its end (``time_us`` at or before it; the last step also takes
    whatever came after, up to the snapshot). Its allocations and frees, its highest allocated, and
    allocated and reserved at its end."""
    i = 0
    for n, row in enumerate(steps):
        row["peak_allocated_bytes"] = allocated
        last = n == len(steps) - 1
        while i < len(trace) and (last or int(trace[i].get("time_us", 0) or 0) <= ends[n]):
            action = trace[i].get("action")
            row["allocations"] += action == "alloc"
            row["frees"] += action == "free_completed"
            allocated += deltas[i][0]
            reserved += deltas[i][1]
            row["peak_allocated_bytes"] = max(row["peak_allocated_bytes"], allocated)
            i += 1
        row["allocated_bytes"], row["reserved_bytes"] = allocated, reserved
