"""Issue 15 benchmark: does torch.profiler's ``stop()`` and its export hold the GIL, and for how long.

Outside any engine, in one process: a transformer-like forward of plain torch ops (about 30 ops per
layer; 6 layers and 5 steps make about 4,000-5,500 trace events, the size of a 5-step capture of
vLLM's CPU worker with the 126M model) runs ``--steps`` times under torch.profiler with each option, then the main thread stops the
profiler and exports its trace while a second thread ticks every millisecond (``time.sleep``, the
GIL taken back after each sleep) and records how late each tick ran. A tick can be late only while
it waits for the GIL or for a CPU; the same ticker beside a main thread that sleeps (GIL free) gives
the host's own lateness, the floor.

Per option, medians of ``--rounds``:
  stop      ``prof.stop()`` on the main thread: wall ms, its CPU ms (thread time, less sensitive to
            a busy host), the ticker's worst lateness during it
  export    ``prof.export_chrome_trace(path)`` (Kineto's ``_ProfilerResult.save``): the same three
  fork      the same recording exported by a forked child instead (the candidate of issue 15, not
            adopted): the parent's ``fork()`` call (page tables copied, under the GIL), the child's
            whole life, and the ticker's worst lateness from the fork until the child is reaped
  events, bytes  of the exported trace

``--ballast-gb`` touches that much memory before measuring, so ``fork()`` copies the page tables of a
process the size of an engine worker (vLLM's CPU worker: 2 GiB anonymous, its KV cache 1 GiB).
An option name ending in " (trace_only)" runs with ``_ExperimentalConfig(trace_only=True)``, as
the probe does (sidecar/probe/capture/profiler.py).

python benchmarks/bench_profiler_stop.py [--rounds 5] [--steps 5] [--layers 6] [--ballast-gb 0]
       [--options none,record_shapes,...] [--out bench-results/profiler_stop.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.profiler as tp  # noqa: E402

OPTIONS = {
    "none": {},
    "record_shapes": {"record_shapes": True},
    "profile_memory": {"profile_memory": True},
    "with_flops": {"with_flops": True},
    "all three": {"record_shapes": True, "profile_memory": True, "with_flops": True},
}
TRACE_ONLY = " (trace_only)"  # an option name with this suffix runs with _ExperimentalConfig(trace_only=True)


class Ticker(threading.Thread):
    """Ticks every ``period`` s and keeps each tick's time; a gap between ticks longer than the
    period is time the thread could not run (waiting for the GIL, or for a CPU)."""

    def __init__(self, period: float = 0.001) -> None:
        super().__init__(daemon=True)
        self.period = period
        self.ticks: list[float] = []
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            time.sleep(self.period)
            self.ticks.append(time.perf_counter())

    def close(self) -> None:
        self._done.set()
        self.join()

    def worst_late_ms(self, begin: float, end: float) -> float:
        """The longest the ticker waited past its period in [begin, end] (gaps that overlap it)."""
        ticks = self.ticks[:]  # appended by the ticker; a copy is a consistent prefix
        worst = 0.0
        for a, b in zip(ticks, ticks[1:]):
            if b >= begin and a <= end:
                worst = max(worst, b - a - self.period)
        return worst * 1e3


def make_layers(layers: int, width: int = 256):
    return [
        {
            "qkv": torch.nn.Linear(width, 3 * width),
            "out": torch.nn.Linear(width, width),
            "up": torch.nn.Linear(width, 4 * width),
            "down": torch.nn.Linear(4 * width, width),
            "ln1": torch.nn.LayerNorm(width),
            "ln2": torch.nn.LayerNorm(width),
        }
        for _ in range(layers)
    ]


@torch.inference_mode()
def forward(layers, x: torch.Tensor, heads: int = 4) -> torch.Tensor:
    """About 30 aten ops per layer, the mix of a decoder layer."""
    batch, seq, width = x.shape
    for layer in layers:
        h = layer["ln1"](x)
        q, k, v = layer["qkv"](h).split(width, dim=-1)
        q = q.view(batch, seq, heads, -1).transpose(1, 2)
        k = k.view(batch, seq, heads, -1).transpose(1, 2)
        v = v.view(batch, seq, heads, -1).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(batch, seq, width)
        x = x + layer["out"](o)
        x = x + layer["down"](torch.nn.functional.gelu(layer["up"](layer["ln2"](x))))
    return x


def profiler(option: str) -> tp.profile:
    kwargs = dict(OPTIONS[option.removesuffix(TRACE_ONLY)])
    if option.endswith(TRACE_ONLY):
        kwargs["experimental_config"] = torch._C._profiler._ExperimentalConfig(trace_only=True)
    return tp.profile(activities=[tp.ProfilerActivity.CPU],
                      schedule=lambda _step: tp.ProfilerAction.RECORD, **kwargs)


def recorded(option: str, layers, x, steps: int) -> tp.profile:
    prof = profiler(option)
    prof.start()
    for n in range(steps):
        if n:
            prof.step()
        forward(layers, x)
    return prof


def one_round(option: str, layers, x, steps: int, ticker: Ticker, folder: str, with_fork: bool) -> dict:
    prof = recorded(option, layers, x, steps)
    t0, c0 = time.perf_counter(), time.thread_time()
    prof.stop()
    t1, c1 = time.perf_counter(), time.thread_time()
    path = os.path.join(folder, "trace.json")
    prof.export_chrome_trace(path)
    t2, c2 = time.perf_counter(), time.thread_time()
    with open(path) as f:
        events = len(json.load(f)["traceEvents"])
    row = {
        "stop_ms": (t1 - t0) * 1e3, "stop_cpu_ms": (c1 - c0) * 1e3, "stop_late_ms": ticker.worst_late_ms(t0, t1),
        "export_ms": (t2 - t1) * 1e3, "export_cpu_ms": (c2 - c1) * 1e3, "export_late_ms": ticker.worst_late_ms(t1, t2),
        "events": events, "bytes": os.path.getsize(path),
    }
    if with_fork:  # the same recording again (a trace is saved once), exported by a forked child
        prof = recorded(option, layers, x, steps)
        prof.stop()
        path = os.path.join(folder, "forked.json")
        t3 = time.perf_counter()
        pid = os.fork()
        if pid == 0:  # the child: the export, nothing else
            code = 1
            try:
                prof.export_chrome_trace(path)
                code = 0
            finally:
                os._exit(code)
        t4 = time.perf_counter()
        _, status = os.waitpid(pid, 0)
        t5 = time.perf_counter()
        if os.waitstatus_to_exitcode(status) != 0 or not os.path.getsize(path):
            raise RuntimeError(f"the forked export failed (status {status})")
        row.update({"fork_call_ms": (t4 - t3) * 1e3, "fork_life_ms": (t5 - t3) * 1e3,
                    "fork_late_ms": ticker.worst_late_ms(t3, t5)})
    return row


def floor_ms(ticker: Ticker, seconds: float = 0.3) -> float:
    """The ticker's worst lateness while the main thread sleeps: the host's share, GIL free."""
    t0 = time.perf_counter()
    time.sleep(seconds)
    return ticker.worst_late_ms(t0, time.perf_counter())


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--ballast-gb", type=float, default=0.0)
    parser.add_argument("--no-fork", action="store_true", help="skip the forked export")
    parser.add_argument("--options", default=",".join([*OPTIONS, "all three" + TRACE_ONLY]))
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "profiler_stop.json")
    args = parser.parse_args(argv)
    options = [o.strip() for o in args.options.split(",") if o.strip()]
    for option in options:
        if option.removesuffix(TRACE_ONLY) not in OPTIONS:
            parser.error(f"unknown option {option!r}; known: {', '.join(OPTIONS)} (each may end in {TRACE_ONLY!r})")
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ballast = None
    if args.ballast_gb > 0:  # touched: resident, so fork() copies its page tables
        ballast = torch.ones(int(args.ballast_gb * (1 << 30)) // 4, dtype=torch.float32)
    layers = make_layers(args.layers)
    x = torch.randn(8, 16, 256)
    forward(layers, x)  # warm-up outside the profiler
    ticker = Ticker()
    ticker.start()
    results: dict = {"load_average": os.getloadavg(), "torch": torch.__version__, "layers": args.layers,
                     "steps": args.steps, "ballast_gb": args.ballast_gb, "options": {}}
    floors = []
    rows: dict[str, list[dict]] = {option: [] for option in options}
    with tempfile.TemporaryDirectory() as folder:
        for n in range(args.rounds):  # options interleaved, their order flipped every round: fair to each
            for option in options if n % 2 == 0 else options[::-1]:
                floors.append(floor_ms(ticker))
                rows[option].append(one_round(option, layers, x, args.steps, ticker, folder, not args.no_fork))
    for option, got in rows.items():
        results["options"][option] = got
        med = {k: statistics.median(r[k] for r in got) for k in got[0] if isinstance(got[0][k], float)}
        print(f"{option:26s} " + "  ".join(f"{k} {v:6.1f}" for k, v in med.items())
              + f"  events {got[0]['events']}  bytes {got[0]['bytes']}", flush=True)
    ticker.close()
    results["floor_late_ms"] = floors
    print(f"ticker's own lateness, main thread asleep: median {statistics.median(floors):.1f} ms, "
          f"worst {max(floors):.1f} ms; load average {os.getloadavg()[0]:.1f}")
    del ballast
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
