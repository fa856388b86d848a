"""The merged trace: every process's checked raw trace written as one gzip Chrome/Kineto trace in
which each process has a clear name and all of them share one timeline.

- the merged trace's base is the smallest of the processes' bases on the sidecar's clock
  (``RawTrace.aligned_base_ns``); each process's ``ts`` is shifted by the difference.
- device tracks (GPU kernels) use the device index as ``pid``, which would collide between ranks:
  they get a pid of their own, named after the owning process (``DEVICE_PID_BASE + index * 256 + n``:
  merged_analysis.py reads a process's index back from it).
- a process whose pid an earlier one already has (two hosts, two containers) gets a track pid of
  its own.
- flow ids (CPU launch → GPU kernel arrows) are made unique per process.
- a process's sampled stacks' slices come first in its events.

Each process's events are one run, in the merged trace's order, and its host pid is listed in the
header (``inference_sidecar.processes``). What each probe noted in its trace's ``inference_sidecar``
member (sidecar/common/phases.py) is kept there too: the phase ranges of all processes in one table, and the
pids of the processes whose step ranges are whole (``whole_steps_pids``, as the merged trace writes
them). The raw files are streamed, one run of about 1 MiB of events at a time: memory does not grow
with the trace.
"""

from __future__ import annotations

import gzip
import json
import os
from itertools import chain, islice
from pathlib import Path
from typing import Any, Iterable, Iterator

from ...analysis.reader.stream import TopLevel, read_events
from ...common.phases import PHASE_RANGES_KEY, TRACE_MEMBER, WHOLE_STEPS_KEY, WHOLE_STEPS_PIDS_KEY
from . import disk_space
from .raw_trace import RawTrace

DEVICE_PID_BASE = 1 << 24  # above Linux's largest pid (2**22)
# A process whose pid an earlier process of the merge already has (two hosts, two containers) gets
# a track pid of its own, between Linux's largest pid and the device tracks'.
SHARED_PID_BASE = 1 << 23
FLOW_ID_STRIDE = 1 << 40
# Process metadata of a raw trace, dropped: the merge writes its own.
_REWRITTEN_METADATA = ("process_name", "process_sort_index", "process_labels")


def write_merged(path: Path, traces: list[RawTrace]) -> None:
    """Merge checked raw traces (in merged-trace order) into one gzip trace at ``path``."""
    ref = min(t.aligned_base_ns for t in traces)
    tmp = path.with_suffix(".tmp")
    try:
        _write_merged(tmp, traces, ref)
        os.replace(tmp, path)
    except BaseException:  # a full disk: closed by the ``with``, deleted here, never left to fill it
        disk_space.unlink_quietly(tmp)
        raise


def _write_merged(tmp: Path, traces: list[RawTrace], ref: int) -> None:
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as out:
        devices = next((t.members.get("deviceProperties") for t in traces if t.members.get("deviceProperties")), [])
        tracks = track_pids(traces)
        header = {
            "schemaVersion": 1,
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": ref,
            "deviceProperties": devices,
            TRACE_MEMBER: {
                "processes": [{"label": t.rec.label, "role": t.rec.role, "pid": pid, "rank": t.rec.rank}
                              for t, pid in zip(traces, tracks)]
            },
        }
        table = phase_ranges(traces)
        if table:  # the processes' phase ranges, for the analysis's step anatomy
            header[TRACE_MEMBER][PHASE_RANGES_KEY] = table
        whole = whole_steps_pids(traces, tracks)
        if whole:  # no step range of these processes is cut off, however short the last
            header[TRACE_MEMBER][WHOLE_STEPS_PIDS_KEY] = whole
        out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
        first = True
        for index, trace in enumerate(traces):
            batches = chain(_batched(trace.sampled_events()),
                            read_events(str(trace.path), TopLevel(), Any, keep=frozenset()))
            for event in _process_events(index, trace.rec, batches, (trace.aligned_base_ns - ref) / 1000.0,
                                         tracks[index]):
                if not first:
                    out.write(",\n")
                out.write(json.dumps(event, separators=(",", ":")))
                first = False
        out.write("\n]}\n")


def phase_ranges(traces: list[RawTrace]) -> dict[str, str]:
    """Every process's phase ranges (range name → phase) in one table: a name is one phase in an engine."""
    table: dict[str, str] = {}
    for trace in traces:
        noted = trace.members.get(TRACE_MEMBER)
        ranges = noted.get(PHASE_RANGES_KEY) if isinstance(noted, dict) else None
        if isinstance(ranges, dict):
            table.update((k, v) for k, v in ranges.items() if isinstance(k, str) and isinstance(v, str))
    return table


def whole_steps_pids(traces: list[RawTrace], tracks: list[int]) -> list[int]:
    """The merged trace's pids (``track_pids``) of the processes whose own trace says that none of its
    step ranges is cut off (``WHOLE_STEPS_KEY``, written by the probe): the fact is per process, and
    the merged trace has one member for all of them."""
    out = []
    for trace, pid in zip(traces, tracks):
        noted = trace.members.get(TRACE_MEMBER)
        if isinstance(noted, dict) and noted.get(WHOLE_STEPS_KEY) is True:
            out.append(pid)
    return out


def track_pids(traces: list[RawTrace]) -> list[int]:
    """Each process's pid in the merged trace: its own, unless an earlier process has the same one
    (processes of two hosts): then ``SHARED_PID_BASE + index``, so each keeps a track and a name."""
    seen: set = set()
    out = []
    for index, trace in enumerate(traces):
        pid = trace.rec.pid if trace.rec.pid not in seen else SHARED_PID_BASE + index
        seen.add(trace.rec.pid)
        out.append(pid)
    return out


def _batched(events: Iterator[dict], size: int = 2048) -> Iterator[list[dict]]:
    while batch := list(islice(events, size)):
        yield batch


def sort_index(rec: Any) -> int:
    """``process_sort_index`` of a process's own track (its device tracks take the next ones), in
    ``sort_key``'s order: window processes, then unranked step-driven ones, then ranked ones by rank."""
    group = 0 if not rec.step_driven else 2 if rec.rank is not None else 1
    return (group * 1000 + (rec.rank or 0)) * 10


def _process_events(index: int, rec: Any, batches: Iterable[list], shift_us: float,
                    track_pid: Any = None) -> Iterator[dict]:
    device_pids: dict[Any, int] = {}
    track_pid = rec.pid if track_pid is None else track_pid

    def pid_for(pid: Any) -> Any:
        if pid == rec.pid:
            return track_pid
        if pid not in device_pids:
            device_pids[pid] = DEVICE_PID_BASE + index * 256 + len(device_pids)
        return device_pids[pid]

    for batch in batches:
        for ev in batch:  # freshly decoded: rewritten in place
            if not isinstance(ev, dict):
                continue
            if ev.get("ph") == "M" and ev.get("name") in _REWRITTEN_METADATA:
                continue  # rewritten below
            if "ts" in ev and shift_us:
                ev["ts"] = round(float(ev["ts"]) + shift_us, 3)
            if "pid" in ev:
                ev["pid"] = pid_for(ev["pid"])
            if ev.get("ph") in ("s", "t", "f") and isinstance(ev.get("id"), int):
                ev["id"] = ev["id"] + (index + 1) * FLOW_ID_STRIDE
            yield ev
    sort_base = sort_index(rec)
    yield _meta("process_name", track_pid, {"name": rec.label})
    yield _meta("process_sort_index", track_pid, {"sort_index": sort_base})
    for n, (orig, pid) in enumerate(device_pids.items()):
        # Integer pids are devices (GPU index); Kineto's own tracks ("Spans", ...) keep their name.
        track = f"device {orig}" if isinstance(orig, int) else (str(orig) or "profiler")
        yield _meta("process_name", pid, {"name": f"{rec.label} {track}"})
        yield _meta("process_sort_index", pid, {"sort_index": sort_base + 1 + n})


def _meta(name: str, pid: Any, args: dict) -> dict:
    return {"ph": "M", "name": name, "pid": pid, "tid": 0, "ts": 0, "args": args}
