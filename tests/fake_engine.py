"""A stand-in engine process for service tests: a real Probe and real torch work in a step loop.

python tests/fake_engine.py ROLE [--rank K] [--steps-then-idle N] [--idle-when FILE] [--step-ms MS] [--slow-step-at N --slow-step-ms MS]
                            [--device cuda --size N] [--grid-ms MS]

                            [--phases] [--nsys-log FILE] [--cuda-graph]

With ``--device cuda`` a worker's step runs its matrix products on the GPU and its probe sees CUDA (tests/gpu).
With ``--cuda-graph`` the step's forward is one CUDA graph replayed (on CPU: tests/fake_cuda_graph.py's
stand-in); ``--phases`` times the step's phases with named ranges; ``--nsys-log`` records an nsys capture's
CUDA profiler and NVTX calls to a file (tests/nsys_calls.py).

``FAKE_ENGINE_CLOCK_SKEW_S`` (environment) makes the process behave as if on a host whose wall clock
is that far ahead: ``time.time_ns``/``time.time`` (the probe's clock replies, rings, sampled stacks) and
the ``baseTimeNanoseconds`` of every trace torch exports. With ``--grid-ms`` each working step begins
on a multiple of that many ms of the true wall clock, so steps of several processes happen together.

``FAKE_ENGINE_PID`` and ``FAKE_ENGINE_HOST`` make the probe claim that pid and host name, as a process
in a container of another host does (two hosts' workers often share role, rank and pid).
"""

import argparse
import asyncio
import json
import os
from pathlib import Path
import threading
import time


def _skew_the_clock(skew_s: float) -> None:
    """Before anything reads the clock (``from time import time_ns`` binds at import)."""
    skew_ns = int(skew_s * 1e9)
    true_time_ns, true_time = time.time_ns, time.time
    time.time_ns = lambda: true_time_ns() + skew_ns
    time.time = lambda: true_time() + skew_s


TRUE_TIME_NS = time.time_ns  # the host's own clock, whatever the skew
CLOCK_SKEW_S = float(os.environ.get("FAKE_ENGINE_CLOCK_SKEW_S") or 0.0)
if CLOCK_SKEW_S:
    _skew_the_clock(CLOCK_SKEW_S)
if os.environ.get("FAKE_ENGINE_PID"):  # read by the probe's identity when it is made
    os.getpid = lambda: int(os.environ["FAKE_ENGINE_PID"])
if os.environ.get("FAKE_ENGINE_HOST"):
    import socket

    socket.gethostname = lambda: os.environ["FAKE_ENGINE_HOST"]
# One OpenMP thread unless told otherwise: torch's second one spins between the stand-in's tiny products
# (about 45 % of a core per engine), which on a 2-core runner starves the sidecar and the other engines.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from sidecar.probe import Probe  # noqa: E402


def _skew_exported_traces(skew_s: float) -> None:
    """Kineto's base time comes from C++, not time.time_ns: move it as a skewed host's would be."""
    original = torch.profiler.profile.export_chrome_trace

    def export_chrome_trace(self, path):
        result = original(self, path)
        with open(path) as f:
            trace = json.load(f)
        trace["baseTimeNanoseconds"] = int(trace["baseTimeNanoseconds"]) + int(skew_s * 1e9)
        with open(path, "w") as f:
            json.dump(trace, f)
        return result

    torch.profiler.profile.export_chrome_trace = export_chrome_trace


def _wait_for_grid(grid_ms: float) -> None:
    grid_ns = int(grid_ms * 1e6)
    now = TRUE_TIME_NS()
    time.sleep((grid_ns - now % grid_ns) / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role")
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--steps-then-idle", type=int, default=None, help="take N working steps, then none")
    parser.add_argument("--idle-when", type=Path, default=None, metavar="FILE",
                        help="take working steps until FILE exists, then none (a test decides when the engine goes idle)")
    parser.add_argument("--step-ms", type=float, default=2.0)
    parser.add_argument("--slow-step-at", type=int, default=None, metavar="N",
                        help="working step N (and every later N-th) takes --slow-step-ms longer")
    parser.add_argument("--slow-step-ms", type=float, default=1500.0)
    parser.add_argument("--planted-sync", action="store_true", help="an .item() in every step (PLANTED_LINE)")
    parser.add_argument("--hang-at-step", type=int, default=None, metavar="N",
                        help="working step N never ends: it blocks in hang_inside_a_step()")
    parser.add_argument("--fake-cuda-watch", type=int, default=0, metavar="EVERY",
                        help="run the always-on sync watch on tests/fake_cuda.py's stand-in for CUDA's sync debug mode, "
                             "sampling one step in EVERY, with a synchronising op in every step (WATCHED_LINE)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where a worker's step runs its products; cuda: its probe records CUDA activity")
    parser.add_argument("--size", type=int, default=32, help="the step's square matrix is SIZE x SIZE")
    parser.add_argument("--instance", default="", help="the engine instance this process belongs to")
    parser.add_argument("--grid-ms", type=float, default=None,
                        help="begin each working step on a multiple of MS of the host's true wall clock")
    parser.add_argument("--model", action="store_true",
                        help="a worker's step runs a small nn.Module model (ModelOfTheFake) and its probe knows it")
    parser.add_argument("--nsys-log", default=None, metavar="FILE",
                        help="a worker's probe claims CUDA and its nsys captures' CUDA profiler and NVTX calls go to "
                             "FILE, one a line (tests/nsys_calls.py), instead of to CUDA: the nsys path on a host without it")
    parser.add_argument("--phases", action="store_true",
                        help="the step's work in two named phase ranges, switched by the probe as an engine's "
                             "(PHASE_PROFILE: 'fake: prepare' is prepare, 'fake: forward' is forward)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="a worker's step replays one CUDA graph of its products (captured once, after a warm-up "
                             "on a side stream), as vLLM's decode steps do; needs --device cuda")
    parser.add_argument("--telemetry", action="store_true",
                        help="start the process's telemetry with the NVML and psutil samplers, as the vLLM plugin does")
    args = parser.parse_args()
    if CLOCK_SKEW_S:
        _skew_exported_traces(CLOCK_SKEW_S)
    watch, fake_sync = _fake_cuda_watch(args.fake_cuda_watch) if args.fake_cuda_watch else (None, None)
    on_gpu = args.device == "cuda" and args.role == "worker"
    if args.telemetry:  # held by main(), which never returns: samplers and pushes run for the process's life
        from sidecar.telemetry import create_telemetry

        telemetry = create_telemetry(args.role, args.rank).start_samplers(process=True, gpu=True)  # noqa: F841
    x = torch.randn(args.size, args.size, device="cuda" if on_gpu else "cpu")
    if args.role == "api_server":
        loop = asyncio.new_event_loop()
        Probe(args.role, args.rank, loop=loop, cuda_available=False, instance=args.instance).start()

        async def serve():
            while True:
                (x @ x).sum()
                await asyncio.sleep(args.step_ms / 1000)

        loop.run_until_complete(serve())
        return
    # On the GPU the probe finds CUDA and reads SIDECAR_SYNC_WATCH itself, as in a real engine.
    model = ModelOfTheFake(args.size).to(x.device) if args.model else None
    known = {"model": lambda: model} if model is not None else {}
    steps = Steps(x, model)
    if args.phases:
        from sidecar.integration.method_ranges import MethodRanges

        known["profile"] = PHASE_PROFILE
        known["phase_scopes"] = MethodRanges(lambda: [(steps, "prepare", "fake: prepare"), (steps, "forward", "fake: forward")])
    if args.nsys_log and args.role == "worker":
        from nsys_calls import RecordingCalls

        known.update(cuda_calls=RecordingCalls(path=args.nsys_log), cuda_available=True)
    if args.cuda_graph:
        steps.capture_graph()
    probe = (Probe(args.role, args.rank, instance=args.instance, **known).start() if on_gpu
             else Probe(args.role, args.rank, **{"cuda_available": False, **known}, sync_watch=watch,
                        instance=args.instance).start())
    taken = 0
    while True:
        has_work = ((args.steps_then_idle is None or taken < args.steps_then_idle)
                    and (args.idle_when is None or not args.idle_when.exists()))
        if args.grid_ms:
            _wait_for_grid(args.grid_ms)
        probe.step_begin(has_work)
        if has_work and taken + 1 == args.hang_at_step:
            hang_inside_a_step()
        if has_work and args.slow_step_at and (taken + 1) % args.slow_step_at == 0:
            time.sleep(args.slow_step_ms / 1000)  # a slow step, inside the step
        if has_work:
            steps.prepare()
            total = steps.forward().sum()
            if args.planted_sync:
                total.item()  # PLANTED_LINE
            if fake_sync is not None:
                fake_sync()  # WATCHED_LINE
            taken += 1
        probe.step_end(has_work, 4 if has_work else 0, 16 if has_work else 0, 0, 4 if has_work else 0)
        time.sleep(args.step_ms / 1000 if has_work else 0.05)
        if not has_work:
            threading.Event().wait()  # an idle engine blocks waiting for work, taking no steps


class Steps:
    """A step's work in two methods, the phases an engine's ranges time (``--phases``), and with
    ``--cuda-graph`` its forward replayed from one captured CUDA graph."""

    def __init__(self, x, model) -> None:
        self.x, self.model = x, model
        self.graph = None
        self.out = None

    def run(self):
        return self.model(self.x) if self.model is not None else self.x @ self.x

    def capture_graph(self) -> None:
        """PyTorch's recipe (torch.cuda.graphs): warm up on a side stream, then capture once; each
        step then replays the graph on the same input and output tensors. Without CUDA,
        tests/fake_cuda_graph.py stands in for ``torch.cuda.CUDAGraph`` (installed as it, so that the
        probe's count of replays finds it): its replay is the step's product into the same output,
        with no call of the model's modules, as a real replay."""
        if self.x.device.type != "cuda":
            from fake_cuda_graph import StandInGraph

            torch.cuda.CUDAGraph = StandInGraph
            x, out = self.x, self.run().detach()
            self.out = out
            self.graph = torch.cuda.CUDAGraph()
            self.graph.capture(lambda: torch.matmul(x, x, out=out))
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                self.run()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.run()

    def prepare(self) -> None:
        """Nothing to prepare: a phase of its own only so that its range is there to see."""

    def forward(self):
        if self.graph is not None:
            self.graph.replay()
            return self.out
        return self.run()


def _phase_profile():
    from sidecar.common.phases import PhaseRange
    from sidecar.engine import EngineProfile

    return EngineProfile(name="fake", phase_ranges=(PhaseRange("fake: prepare", "prepare", "worker"),
                                                    PhaseRange("fake: forward", "forward", "worker")))


PHASE_PROFILE = _phase_profile()


class ModelOfTheFake(torch.nn.Module):
    """Two blocks of attention-like and MLP-like layers: module paths and types to time."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(size), "mlp": torch.nn.Sequential(
                torch.nn.Linear(size, 2 * size), torch.nn.GELU(), torch.nn.Linear(2 * size, size))})
            for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = x + block["mlp"](block["norm"](x))
        return x


def hang_inside_a_step() -> None:
    """A forward that never returns (the GIL released, as in a blocked kernel launch or a collective)."""
    threading.Event().wait()


def _fake_cuda_watch(every: int):
    from fake_cuda import FILE, FakeSwitch, make_sync_op

    from sidecar.syncs import SiteLocator, SyncWatch
    from sidecar.syncs.sites import default_skip_dirs

    switch = FakeSwitch()
    locator = SiteLocator(skip_dirs=default_skip_dirs() + (FILE,))
    return SyncWatch(switch, every=every, locator=locator), make_sync_op(switch)


if __name__ == "__main__":
    main()
