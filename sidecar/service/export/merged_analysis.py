"""The summary of a merged trace, built one process at a time in one streaming pass.

A merged trace is one file with every rank in it; analysing it as one file (``analyze_path``) kept
the compact columns of every event until the end, so its memory grew with the number of ranks.
merged_trace.py writes each process's events as one run and names the process in every pid it
gives, so here each process's run is collected, analysed and let go before the next; only its
results stay.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...analysis.reader.stream import TopLevel, read_events
from .merged_trace import DEVICE_PID_BASE


def analyse_by_process(merged: Path, top_n: int = 10) -> dict:
    """``analyze_path(merged)``'s summary, built one process at a time in one streaming pass.

    ``analyze_path`` keeps the compact columns of every event it uses until the end of a file, and a
    merged trace is one file with every rank in it: its peak grew with the number of ranks. Here
    it does not (the sidecar's peak at 8 and 64 ranks of a 10 MB trace: 83 and 89 MiB; the analysis
    step at 64, 55 MiB; docs/benchmarks.md, "Many ranks"). A merged
    trace holds each process's events in one run (merged_trace.py), its host pid listed in the
    header and its device tracks' pids naming it (``DEVICE_PID_BASE + index * 256 + n``), so each
    process is collected, analysed and let go before the next; only its results stay. Its GPU
    activities are then joined to its own launches only: the same owners as in the whole file,
    where ranks that launch in lockstep repeat each other's correlation ids (a search per activity
    among every rank's launches, which made the whole file's analysis time grow faster than the
    ranks). A trace whose header lists no processes is analysed as one, as ``analyze_path`` does.
    Raises TraceFormatError for an unreadable trace."""
    from ...analysis import summary as analysis
    from ...analysis.reader.stream import KEPT_MEMBERS

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
        from ...analysis.reader.events import CompleteEvent, MetadataEvent

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
            from ...analysis.reader.collect import Collector

            self._collector = Collector(self.path)
        self._collector.add(events)

    def finish_process(self) -> None:
        """Analyse the run collected so far, keep its results and drop its columns."""
        if self._collector is None:
            return
        from ...analysis import summary as analysis
        from ...analysis.reader.processes import split_processes

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
