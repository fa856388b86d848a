"""Turn the per-process traces of one capture into what users download, off every engine process.

Probes write plain Kineto JSON (the fastest thing torch can do while it holds the GIL); here, in the
sidecar, each file is compressed, and all of them are merged into one gzip Chrome/Kineto trace in
which every process has a clear name and all of them share one timeline:

- Kineto writes ``ts`` relative to ``baseTimeNanoseconds`` (wall clock, per process); the merged
  trace uses the smallest base and shifts the others by the difference. A process whose clock is
  measurably off the sidecar's (another host: clock_sync.py) has its base corrected first.
- device tracks (GPU kernels) use the device index as ``pid``, which would collide between ranks:
  they get a pid of their own, named after the owning process.
- flow ids (CPU launch → GPU kernel arrows) are made unique per process.
- a process that sampled Python stacks left its samples beside its trace, unprocessed
  (sidecar/stack_samples.py): here they become that process's flame-chart slices, inserted first in
  its events (``kineto_file.copy_with_events`` while its file is compressed, and into the merged
  stream), and its ``stack_summary`` (sidecar/analysis/sampled_stacks.py). A samples file that is
  missing or unreadable loses the stacks, never the trace: the process's summary says why.

Memory does not grow with the trace: each raw file is streamed twice with the analyser's reader
(``sidecar.analysis.stream``), never loaded whole. The first pass checks the JSON without building
the events (``msgspec.Raw``) and finds the members the merged header needs (Kineto writes
``baseTimeNanoseconds`` after ``traceEvents``); the second decodes the events one run of about
1 MiB at a time, rewrites them and writes them out. Nor does it grow with the number of processes:
the merged trace is analysed one process at a time (``analyse_by_process``), not as one file.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterable, Iterator

import msgspec

from .. import stack_samples
from ..analysis import python_stacks, sampled_stacks
from ..analysis.errors import TraceFormatError
from ..analysis.stream import TopLevel, read_events
from ..protocol import P_DONE
from . import disk_space, kineto_file

log = logging.getLogger(__name__)

RAW_DIR = "raw"  # <a probe's trace root>/captures/<id>/raw/: where the probes write their plain JSON traces
MERGED_NAME = "trace.json.gz"
SUMMARY_NAME = "summary.json"
PROCESS_TRACE_SUFFIX = ".pt.trace.json.gz"  # the suffix TensorBoard's profiler plugin looks for
DEVICE_PID_BASE = 1 << 24  # above Linux's largest pid (2**22)
# A process whose pid an earlier process of the merge already has (two hosts, two containers) gets
# a track pid of its own, between Linux's largest pid and the device tracks'.
SHARED_PID_BASE = 1 << 23
FLOW_ID_STRIDE = 1 << 40
# Top-level members of a raw trace that the merged header takes.
# ``inference_sidecar``: what the probe noted in its trace (its phase ranges, sidecar/phases.py).
_HEADER_MEMBERS = frozenset({"baseTimeNanoseconds", "deviceProperties", "inference_sidecar"})
# Process metadata of a raw trace, dropped: the merge writes its own.
_REWRITTEN_METADATA = ("process_name", "process_sort_index", "process_labels")


@dataclass
class ProcessOutcome:
    file: str | None = None
    bytes: int = 0
    error: str | None = None
    stack_summary: dict[str, Any] | None = None  # from its samples file (sampled stacks)


@dataclass
class FinalizeResult:
    trace_file: str | None = None
    trace_bytes: int = 0
    problems: list[str] = field(default_factory=list)
    processes: dict[str, ProcessOutcome] = field(default_factory=dict)
    summary_file: str | None = None
    headline: str | None = None


@dataclass
class RawTrace:
    """One process's raw trace, checked, with the top-level members the merged header needs."""

    rec: Any  # the capture's process record: label, role, pid, rank, step_driven, sort_key
    path: Path
    members: dict[str, Any]
    stacks: stack_samples.Samples | None = None  # its sampled Python stacks, added to its events

    @property
    def base_ns(self) -> int:
        """The file's own base: its process's wall clock."""
        return int(self.members.get("baseTimeNanoseconds") or 0)

    @property
    def aligned_base_ns(self) -> int:
        """The base on the sidecar's clock: less the process's clock offset where that was
        measurably off (another host; clock_sync.py), else the file's own."""
        return self.base_ns - int(getattr(self.rec, "clock_correction_ns", 0) or 0)

    def sampled_events(self) -> Iterator[dict]:
        """The sampled stacks' events on this file's clock (none without sampled stacks)."""
        return sampled_stacks.iter_events(self.stacks, self.base_ns) if self.stacks is not None else iter(())


def lower_priority() -> None:
    """Executor thread initializer: compression and merging yield the CPU to the engine."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass


def check_trace(rec: Any, path: Path) -> RawTrace:
    """The first pass over a raw trace: the whole JSON is checked and the header's members kept.
    Raises ValueError (``TraceFormatError``) for a file that is not a Kineto trace."""
    top = TopLevel()
    for _batch in read_events(str(path), top, msgspec.Raw, keep=_HEADER_MEMBERS):
        pass
    if top.array_format:
        raise TraceFormatError(str(path), "not a Kineto trace (no traceEvents list)")
    return RawTrace(rec, path, top.members)


def raw_trace_path(capture_dir: Path, raw_file: str) -> Path | None:
    """The raw trace a probe reported, resolved, if it is one of this capture's: a ``.json`` file in a
    folder ``raw`` of a folder named after the capture (``<trace root>/captures/<id>/raw/``, under the
    sidecar's trace dir or the probe's own root). None for any other path: never read nor deleted."""
    return _reported_raw_file(capture_dir, raw_file, ".json")


def raw_samples_path(capture_dir: Path, samples_file: str) -> Path | None:
    """The raw samples file a probe reported (``.stacks.msgpack``), under the same rule as its trace."""
    return _reported_raw_file(capture_dir, samples_file, stack_samples.SUFFIX)


def _reported_raw_file(capture_dir: Path, reported: str, suffix: str) -> Path | None:
    path = Path(reported).resolve()
    if not path.name.endswith(suffix) or path.parent.name != RAW_DIR or path.parent.parent.name != capture_dir.name:
        return None
    return path if path.is_file() else None


def load_samples(capture_dir: Path, samples_file: str | None) -> tuple[stack_samples.Samples | None, str | None]:
    """(the samples, None) or (None, why they are lost) for a process's reported samples file."""
    if not samples_file:
        return None, None
    path = raw_samples_path(capture_dir, samples_file)
    if path is None:
        return None, "python stacks lost: samples file missing or outside the capture's raw folder"
    try:
        return stack_samples.read(path), None
    except OSError as exc:
        return None, f"python stacks lost: samples file unreadable: {disk_space.describe(exc)}"
    except ValueError as exc:
        return None, f"python stacks lost: samples file unreadable: {exc}"


def finalize_capture(capture_dir: Path, records: Iterable[Any], max_bytes: int) -> FinalizeResult:
    """Compress, merge and analyse the raw traces of the finished processes in ``records``, with
    their sampled stacks (``stacks_file``, when a record has one); then delete them and the folders
    they leave empty."""
    records = list(records)
    result = FinalizeResult()
    taken: list[Path] = []  # this capture's raw files: deleted at the end, whatever happens
    kept = []
    total = 0
    # Ranked processes (the GPU workers) first: if the size limit bites, the GPU-side story is what
    # matters most.
    for rec in sorted(records, key=lambda r: (r.rank is None, r.sort_key)):
        if rec.state != P_DONE or not rec.raw_file:
            continue
        samples_file = getattr(rec, "stacks_file", None)
        samples_path = raw_samples_path(capture_dir, samples_file) if samples_file else None
        if samples_path is not None:
            taken.append(samples_path)
        raw = raw_trace_path(capture_dir, rec.raw_file)
        if raw is None:
            result.processes[rec.stem] = ProcessOutcome(error="trace file missing or outside the capture's raw folder")
            continue
        taken.append(raw)
        size = raw.stat().st_size
        if size == 0:  # a probe's export that wrote nothing: say so, not "Expecting value"
            result.processes[rec.stem] = ProcessOutcome(error=_unreadable("empty trace file (0 bytes)", raw))
            continue
        stacks, stacks_error = load_samples(capture_dir, samples_file)
        size += stacks.raw.estimated_bytes if stacks is not None else 0  # the slices it adds
        if total + size > max_bytes:
            result.processes[rec.stem] = ProcessOutcome(error=f"dropped: capture size limit of {max_bytes // 2**20} MiB reached")
            result.problems.append(f"size limit of {max_bytes // 2**20} MiB reached")
            continue
        total += size
        kept.append((rec, raw, stacks, stacks_error))

    kept.sort(key=lambda item: item[0].sort_key)
    traces: list[RawTrace] = []
    try:
        for rec, raw, stacks, stacks_error in kept:
            try:
                trace = check_trace(rec, raw)
            except TraceFormatError as exc:
                result.processes[rec.stem] = ProcessOutcome(error=_unreadable(exc.problem, raw))
                continue
            except (OSError, ValueError) as exc:
                result.processes[rec.stem] = ProcessOutcome(error=_unreadable(disk_space.describe(exc), raw))
                continue
            gz_name = rec.stem + PROCESS_TRACE_SUFFIX
            trace.stacks = stacks
            try:
                stacks_error = _compress_with_stacks(trace, capture_dir / gz_name) or stacks_error
            except OSError as exc:
                result.processes[rec.stem] = ProcessOutcome(error=f"compression failed: {disk_space.describe(exc)}")
                continue
            result.processes[rec.stem] = ProcessOutcome(file=gz_name, bytes=(capture_dir / gz_name).stat().st_size,
                                                        stack_summary=_stack_summary(stacks, stacks_error))
            traces.append(trace)
        if traces:
            merged = capture_dir / MERGED_NAME
            try:
                write_merged(merged, traces)
                result.trace_file, result.trace_bytes = MERGED_NAME, merged.stat().st_size
            except OSError as exc:
                result.problems.append(f"merge failed: {disk_space.describe(exc)}")
    finally:
        remove_raw(capture_dir, taken)
    if result.trace_file:
        summaries = {stem: o.stack_summary for stem, o in result.processes.items() if o.stack_summary is not None}
        result.summary_file, result.headline = _analyse(capture_dir, capture_dir / MERGED_NAME, records, summaries)
    return result


def _stack_summary(stacks: stack_samples.Samples | None, error: str | None) -> dict[str, Any] | None:
    """A process's ``stack_summary``: its samples' summary, or what happened to them."""
    summary: dict[str, Any] | None = None
    if stacks is not None:
        try:
            summary = sampled_stacks.summary(stacks)
        except Exception as exc:  # a bug here must not cost the capture
            log.exception("summary of sampled stacks failed")
            error = f"python stacks summary failed: {exc}"
    if error is None:
        return summary
    return {**(summary or {"samples": 0}), "error": error[:500]}


def _unreadable(problem: str, raw: Path) -> str:
    """Why a raw trace cannot be used. A probe whose export ran out of space leaves an empty or
    cut-short file and may never learn why (Kineto's writer does not raise): when the disk it lies
    on is (nearly) full, that is the cause to name."""
    if disk_space.low_on_space(raw.parent):
        return f"{disk_space.NO_SPACE} ({raw.parent}): the trace was cut short ({problem})"
    return f"unreadable trace: {problem}"


def _compress_with_stacks(trace: RawTrace, target: Path) -> str | None:
    """``_compress`` with the trace's sampled stacks. When they cannot go in (anything but an I/O
    error), the trace is compressed without them and dropped from the merge; returns why."""
    try:
        _compress(trace.path, target, trace.sampled_events())
        return None
    except OSError:
        raise
    except Exception as exc:
        if trace.stacks is None:
            raise
        log.warning("%s: sampled stacks not added: %s", trace.path, exc)
        trace.stacks = None
        _compress(trace.path, target)
        return f"python stacks not added to the trace: {exc}"


def _compress(raw: Path, target: Path, events: Iterable[dict] = ()) -> None:
    """gzip ``raw`` into ``target``, with ``events`` first in its ``traceEvents``; on failure no
    partial ``target`` stays (the files are closed first)."""
    try:
        with raw.open("rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
            kineto_file.copy_with_events(src, dst, events, str(raw))
    except BaseException:
        disk_space.unlink_quietly(target)
        raise


def remove_raw(capture_dir: Path, files: Iterable[Path]) -> None:
    """Delete this capture's raw files, its own ``raw/`` folder, and in a probe's own trace root the
    ``raw/`` and ``<id>/`` folders they leave empty (never a folder with anything else in it)."""
    folders = set()
    for path in files:
        path.unlink(missing_ok=True)
        folders.add(path.parent)
    shutil.rmtree(capture_dir / RAW_DIR, ignore_errors=True)
    for raw_dir in folders:
        for folder in (raw_dir, raw_dir.parent):
            if folder == capture_dir.resolve():
                break
            try:
                folder.rmdir()
            except OSError:  # not empty, gone already, or not ours to remove
                break


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
            "inference_sidecar": {
                "processes": [{"label": t.rec.label, "role": t.rec.role, "pid": pid, "rank": t.rec.rank}
                              for t, pid in zip(traces, tracks)]
            },
        }
        table = phase_ranges(traces)
        if table:  # the processes' phase ranges, for the analysis's step anatomy
            header["inference_sidecar"]["phase_ranges"] = table
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
        noted = trace.members.get("inference_sidecar")
        ranges = noted.get("phase_ranges") if isinstance(noted, dict) else None
        if isinstance(ranges, dict):
            table.update((k, v) for k, v in ranges.items() if isinstance(k, str) and isinstance(v, str))
    return table


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


def _analyse(capture_dir: Path, merged: Path, records: Iterable[Any] = (),
             stack_summaries: dict[str, dict] | None = None) -> tuple[str | None, str | None]:
    """Analysis is a bonus on top of the trace: its failure is reported in the headline only. The
    sampled Python stacks go into the summary's ``python_stacks`` and the headline: each process's
    ``stack_summary``, or the one built here from its samples (``stack_summaries``, by stem)."""
    try:
        from ..analysis import summary as _analysis_available  # noqa: F401
    except ImportError:
        return None, None
    try:
        summary = analyse_by_process(merged)
    except Exception as exc:  # analysis is a bonus: the trace is still there
        log.warning("analysis of %s failed: %s", merged, exc)
        return None, f"analysis failed: {exc}"
    built = stack_summaries or {}
    stacks = python_stacks.section(
        SimpleNamespace(label=r.label, stacks=getattr(r, "stacks", "none"),
                        stack_summary=built.get(r.stem, getattr(r, "stack_summary", None))) for r in records)
    if stacks:
        summary["python_stacks"] = stacks
        extra = python_stacks.headline(stacks)
        if extra:
            summary["headline"] = "; ".join(filter(None, (summary.get("headline"), extra)))
    try:
        disk_space.write_atomic(capture_dir / SUMMARY_NAME, json.dumps(summary, indent=1))
    except OSError as exc:  # the trace is still there; the headline says why there is no summary
        log.warning("summary of %s not saved: %s", merged, exc)
        return None, f"summary not saved: {disk_space.describe(exc)}"
    return SUMMARY_NAME, summary.get("headline")


def analyse_by_process(merged: Path, top_n: int = 10) -> dict:
    """``analyze_path(merged)``'s summary, built one process at a time in one streaming pass.

    ``analyze_path`` keeps the compact columns of every event it uses until the end of a file, and a
    merged trace is one file with every rank in it: its peak grew with the number of ranks (135 MiB
    for 64 ranks of a 10 MB trace, against 50 MiB here; docs/benchmarks.md, "Many ranks"). A merged
    trace holds each process's events in one run (``_write_merged``), its host pid listed in the
    header and its device tracks' pids naming it (``DEVICE_PID_BASE + index * 256 + n``), so each
    process is collected, analysed and let go before the next; only its results stay. Its GPU
    activities are then joined to its own launches only: the same owners as in the whole file,
    where ranks that launch in lockstep repeat each other's correlation ids (a search per activity
    among every rank's launches, which made the whole file's analysis time grow faster than the
    ranks). A trace whose header lists no processes is analysed as one, as ``analyze_path`` does.
    Raises TraceFormatError for an unreadable trace."""
    from ..analysis import summary as analysis
    from ..analysis.stream import KEPT_MEMBERS

    top = TopLevel()
    walk = _ProcessRuns(str(merged), top, top_n)
    for batch in read_events(str(merged), top, keep=KEPT_MEMBERS | {"inference_sidecar"}):
        walk.add(batch)
    walk.finish_process()
    files = [{"path": str(merged), "bytes": merged.stat().st_size, "events": walk.events,
              "time_resolution": "ns" if walk.fractional_ts else "us", "processes": walk.processes}]
    warnings = []
    if top.skipped_events:
        warnings.append(f"{merged.name}: {top.skipped_events} events skipped: fields of unusable type")
    if walk.ignored:
        warnings.append(f"{merged.name}: {walk.ignored} events without a usable 'X' timestamp ignored")
    return analysis.summarize_results(merged, files, walk.results, warnings, top_n)


class _ProcessRuns:
    """Cuts a merged trace's event batches into its processes' runs, and analyses each run as a file
    of its own (``analysis.summary``: collect, split into views, ``analyze_process``)."""

    def __init__(self, path: str, top: TopLevel, top_n: int) -> None:
        from ..analysis.events import CompleteEvent, MetadataEvent

        self.path, self.top, self.top_n = path, top, top_n
        self._with_pid = (CompleteEvent, MetadataEvent)  # the other phases are decoded without their pid
        # host pid -> the indices in the header of the processes with that pid (two hosts may share one)
        self._host: dict[Any, list[int]] | None = None
        self._current: int | None = None
        self._collector: Any = None
        self._skipped_before = 0
        self.results: list[Any] = []
        self.events = self.processes = self.ignored = 0
        self.fractional_ts = False

    def _process(self, ev: Any) -> int | None:
        """The index of the process ``ev`` belongs to; None when the event does not say (flow arrows,
        instants: they stay with the run they are in)."""
        if type(ev) not in self._with_pid:
            return None
        pid = ev.pid
        if type(pid) is int and pid >= DEVICE_PID_BASE:
            return (pid - DEVICE_PID_BASE) >> 8
        indices = self._host.get(pid)
        if indices is None or self._current in indices:
            return None if indices is None else self._current
        return next((i for i in indices if self._current is None or i > self._current), indices[0])

    def add(self, batch: list) -> None:
        if self._host is None:
            listed = (self.top.members.get("inference_sidecar") or {}).get("processes") or []
            self._host = {}
            for i, p in enumerate(listed):
                if isinstance(p, dict):
                    self._host.setdefault(p.get("pid"), []).append(i)
            if not self._host:  # not a merged trace of this sidecar: the whole file is one run
                self._process = lambda ev: None  # type: ignore[method-assign]
        start = 0
        while start < len(batch):
            cut = self._next_run(batch, start)
            if cut is None:
                self._collect(batch[start:] if start else batch)
                return
            if self._current is None:  # the first process: what came before its first event is its own
                self._current = self._process(batch[cut])
                continue
            if cut > start:
                self._collect(batch[start:cut])
            self.finish_process()
            self._current = self._process(batch[cut])
            start = cut

    def _next_run(self, batch: list, start: int) -> int | None:
        """The index of the first event from ``start`` on that is another process's; None when none is.
        A process's events are one run: when the batch's last event that names a process names the
        current one, so does every event before it (the common case, decided without a scan)."""
        for i in range(len(batch) - 1, start - 1, -1):
            last = self._process(batch[i])
            if last is not None:
                break
        else:
            return None
        if last == self._current:
            return None
        for i in range(start, len(batch)):
            found = self._process(batch[i])
            if found is not None and found != self._current:
                return i
        return None

    def _collect(self, events: list) -> None:
        if self._collector is None:
            from ..analysis.collect import Collector

            self._collector = Collector(self.path)
        self._collector.add(events)

    def finish_process(self) -> None:
        """Analyse the run collected so far, keep its results and drop its columns."""
        if self._collector is None:
            return
        from ..analysis import summary as analysis
        from ..analysis.processes import split_processes

        skipped = self.top.skipped_events - self._skipped_before
        self._skipped_before = self.top.skipped_events
        data = self._collector.finish(self.top.members, skipped)
        self._collector = None
        views = split_processes(data)
        self.events += data.event_count
        self.ignored += data.ignored_count
        self.processes += len(views)
        self.fractional_ts = self.fractional_ts or data.fractional_ts
        self.results.extend(analysis.analyze_process(view, self.top_n) for view in views)
