"""Issue 13 benchmark: what the module-timing job costs per step (hooks on vs off).

The project's local Llama models (``sidecar make-model``: tiny, 2 layers of hidden 128; 126m, 8 layers
of hidden 1024), loaded with transformers, random weights, fp32 on the CPU, one thread; a step is one
forward of a batch (``--batch`` 8 sequences x ``--tokens`` 4, inference_mode: about a decode step's
work, no KV cache). Side by side in alternating rounds:

  off   the bare step
  on    the same step inside a module-timing job (sidecar/probe/modules_job.py, driven through its step
        window as a probe drives it): every module's forward pre-hook and forward hook fire, timed on
        the host clock

Per step: the median of each round's median step time; the cost is on − off, per step and per hooked
module call (two hooks each). The job's first and last steps also put the hooks in and take them out:
those two are timed apart (``install_ms``, ``remove_ms``). Results: a table and
``bench-results/modules.json``.

    python benchmarks/bench_modules.py [--sizes tiny,126m] [--steps 30] [--rounds 5] [--batch 8] [--tokens 4]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from sidecar.cli.make_model import build_model  # noqa: E402
from sidecar.probe.modules_timer import ModuleTimer, hook_count  # noqa: E402
from sidecar.probe.modules_job import ModuleTiming  # noqa: E402
from sidecar.common.protocol import ModuleSpec  # noqa: E402


def load(size: str, folder: Path):
    from transformers import AutoModelForCausalLM

    path = build_model(folder / size, size=size)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def step_times(model, ids, steps: int, job: ModuleTiming | None) -> list[float]:
    """Seconds of each step; with ``job``, driven through its window from its first step on."""
    out = []
    with torch.inference_mode():
        for n in range(steps):
            began = time.perf_counter()
            if job is not None:
                job.on_step_begin(True, n)
            model(ids)
            if job is not None:
                job.on_step_end(True)
            out.append(time.perf_counter() - began)
    return out


def measure(model, steps: int, rounds: int, batch: int, tokens: int) -> dict:
    ids = torch.randint(0, model.config.vocab_size, (batch, tokens))
    calls_per_step = len(list(model.named_modules()))  # every module runs once per forward here
    step_times(model, ids, 5, None)  # warm-up
    off, on, install, remove = [], [], [], []
    with ThreadPoolExecutor(1) as exporter:
        for r in range(rounds):
            off.append(statistics.median(step_times(model, ids, steps, None)))
            done = []
            # steps + 2: the first step puts the hooks in, the last takes them out; both left out.
            job = ModuleTiming(ModuleSpec(id=f"m20260101-000000-{r:06x}", steps=steps + 2), done.append,
                               lambda: model, exporter)
            job.begin(0)
            times = step_times(model, ids, steps + 2, job)
            on.append(statistics.median(times[1:-1]))
            # The hooks' setup and removal alone (on the step thread in a job's first and last step).
            timer = ModuleTimer(model)
            t0 = time.perf_counter()
            timer.install()
            t1 = time.perf_counter()
            timer.remove()
            t2 = time.perf_counter()
            install.append(t1 - t0)
            remove.append(t2 - t1)
            assert hook_count(model) == 0, "a hook was left behind"
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    cost_us = (on_ms - off_ms) * 1e3
    return {
        "modules": calls_per_step, "off_ms": round(off_ms, 4), "on_ms": round(on_ms, 4),
        "cost_us_per_step": round(cost_us, 1), "cost_fraction": round(cost_us / (off_ms * 1e3), 4),
        "cost_us_per_module_call": round(cost_us / calls_per_step, 3),
        "install_ms": round(statistics.median(install) * 1e3, 3), "remove_ms": round(statistics.median(remove) * 1e3, 3),
        "off_rounds_ms": [round(x * 1e3, 4) for x in off], "on_rounds_ms": [round(x * 1e3, 4) for x in on],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,126m", help="local model sizes (default %(default)s)")
    parser.add_argument("--steps", type=int, default=30, help="steps per round and mode (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default %(default)s)")
    parser.add_argument("--batch", type=int, default=8, help="sequences per step (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=4, help="tokens per sequence (default %(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench-results" / "modules.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    import os

    results = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
               "batch": args.batch, "tokens": args.tokens,
               "load_at_start": os.getloadavg(), "steps": args.steps, "rounds": args.rounds, "sizes": {}}
    print(f"{'model':>6} {'modules':>8} {'off ms':>9} {'on ms':>9} {'cost/step':>10} {'share':>7} {'per call':>9} "
          f"{'install':>9} {'remove':>8}")
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes.split(","):
            r = measure(load(size, Path(folder)), args.steps, args.rounds, args.batch, args.tokens)
            results["sizes"][size] = r
            print(f"{size:>6} {r['modules']:>8} {r['off_ms']:>9.3f} {r['on_ms']:>9.3f} {r['cost_us_per_step']:>8.1f}µs "
                  f"{r['cost_fraction'] * 100:>6.1f}% {r['cost_us_per_module_call']:>7.2f}µs {r['install_ms']:>7.2f}ms "
                  f"{r['remove_ms']:>6.2f}ms")
    results["load_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
