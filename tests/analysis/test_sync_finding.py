"""The sync finding on its own (what ``sidecar.analysis.sync_sites`` runs) finds exactly what the whole
per-process analysis finds, on every recorded trace."""

from __future__ import annotations

import pytest

from sidecar.analysis.questions import intervals, kernels
from sidecar.analysis.reader.processes import split_processes
from sidecar.analysis.summary import analyze_process, load
from sidecar.analysis.questions.gaps import find_process_syncs

from .conftest import TRACE_NAMES, trace_path


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_sync_finding_alone_matches_the_whole_analysis(name):
    for view in split_processes(load(trace_path(name))):
        gpu = kernels.gpu_stats(view, view.window())
        busy = intervals.union(*intervals.concat(list(gpu.device_busy.values())))
        alone = kernels.busy_union(view)
        assert alone.start.tolist() == busy.start.tolist() and alone.end.tolist() == busy.end.tolist()
        assert find_process_syncs(view) == analyze_process(view, 1).syncs
