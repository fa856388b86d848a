"""CUDA graph replays counted while a job's window is open (sidecar/common/cuda_graphs.py), with a stand-in
graph class: the count, the steps that replayed, the class left as it was; and the two jobs that cannot see
inside a replay, module timing and a sync scan, report those steps instead of zeros alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from fake_cuda_graph import StandInGraph
from sidecar.common.cuda_graphs import GraphReplays
from sidecar.common.protocol import ModuleSpec, SyncSpec
from sidecar.probe.modules_job import ModuleTiming
from sidecar.syncs.scan import SyncScan


class Graph(StandInGraph):
    """A class of its own per test: installing on it touches nothing else."""


def test_replays_are_counted_only_while_installed_and_the_class_is_left_as_it_was():
    class G(Graph):
        pass

    G.replay = StandInGraph.replay  # its own attribute, as torch.cuda.CUDAGraph has
    own = G.__dict__["replay"]
    graph = G()
    ran = []
    graph.capture(lambda: ran.append(1))
    counter = GraphReplays(G)
    graph.replay()  # before: not counted
    counter.install()
    for step_replays in (2, 0, 1):
        counter.step_began()
        for _ in range(step_replays):
            graph.replay()
        counter.step_ended()
    counter.uninstall()
    graph.replay()  # after: not counted
    assert (counter.replays, counter.steps) == (3, 2) and len(ran) == 5
    assert G.__dict__["replay"] is own


def test_an_inherited_replay_is_wrapped_and_then_found_again():
    class G(Graph):
        pass

    counter = GraphReplays(G)
    counter.install()
    assert "replay" in G.__dict__
    g = G()
    g.capture(lambda: None)
    g.replay()
    counter.uninstall()
    assert "replay" not in G.__dict__ and counter.replays == 1


def test_wrapped_again_by_someone_else_uninstall_leaves_theirs_and_stops_counting():
    class G(Graph):
        pass

    G.replay = StandInGraph.replay
    counter = GraphReplays(G)
    counter.install()
    ours = G.replay
    theirs_calls = []

    def theirs(graph):
        theirs_calls.append(1)
        return ours(graph)

    G.replay = theirs
    counter.uninstall()
    assert G.replay is theirs
    g = G()
    g.capture(lambda: None)
    g.replay()
    assert theirs_calls == [1] and counter.replays == 0


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x)


def run_steps(job, steps, work):
    for n in range(steps):
        job.on_step_begin(True, n)
        work(n)
        job.on_step_end(True)


def test_module_timing_says_how_many_steps_replayed_a_graph():
    class G(Graph):
        pass

    model, x = Tiny(), torch.randn(2, 4)
    graph = G()
    graph.capture(lambda: torch.matmul(x, model.linear.weight.t()))  # no module call, as a replay
    reports = []
    with ThreadPoolExecutor(1) as exporter:
        job = ModuleTiming(ModuleSpec(id="m1", steps=4), reports.append, lambda: model, exporter,
                           graphs=GraphReplays(G))
        job.begin(0)
        # The first step runs eagerly (as a prefill), the next three replay the graph (as decodes).
        run_steps(job, 4, lambda n: model(x) if n == 0 else graph.replay())
    done = reports[-1]
    assert done.state == "done" and done.steps_recorded == 4
    assert (done.graph_steps, done.graph_replays) == (3, 3)
    assert {r.path: r.calls for r in done.rows}[""] == 1  # the hooks saw the eager step only
    assert "replay" not in G.__dict__


def test_a_sync_scan_says_how_many_steps_replayed_a_graph():
    class G(Graph):
        pass

    graph = G()
    graph.capture(lambda: None)
    reports = []
    scan = SyncScan(SyncSpec(id="s1", steps=2), reports.append, graphs=GraphReplays(G))
    scan.begin(0)
    run_steps(scan, 2, lambda n: graph.replay())
    done = reports[-1]
    assert done.state == "done" and (done.graph_steps, done.graph_replays) == (2, 2)


def test_an_eager_window_reports_no_graph():
    reports = []
    scan = SyncScan(SyncSpec(id="s2", steps=2), reports.append, graphs=GraphReplays(Graph))
    scan.begin(0)
    run_steps(scan, 2, lambda n: None)
    assert (reports[-1].graph_steps, reports[-1].graph_replays) == (0, 0)
