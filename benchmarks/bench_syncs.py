"""Issue 4 benchmark: what the hidden-sync detector costs per step.

A small Llama-style forward loop (the tiny model's shape: 2 layers, hidden 128, vocab 2048; batch
8 x 16 tokens, one thread, inference_mode), timed side by side in alternating rounds:
  none       the bare loop
  disarmed   a SyncScan driven through its step interface every step but never begun (what a
             probe pays while a scan waits for the sidecar's start step), after an earlier scan was
             armed and removed again
  armed      the detector armed and scanning every step (no syncs in the loop: pure overhead)
  armed_cpu  armed with treat_cpu_as_device (CPU tensors watched too, host buffers tracked)
  bare_mode  an empty TorchDispatchMode: torch's own price for sending every op through Python,
             the floor under "armed"
Per-op cost: (armed - none) / aten ops per step. Per-sync cost: an ``.item()`` armed vs bare.
The always-on watch (watch.py) with a stand-in for torch's CUDA switch (no GPU here): what a step
it does not sample costs, and what each sync warning it takes costs (the warning raised the way
c10 raises it, through Python's warnings machinery, then the hook's stack walk). On a CUDA host also
the watch on torch's real switch: a ``.item()`` of a small CUDA tensor with the watch off, and in a
step it samples (CUDA's sync debug mode on, the warning taken by the watch).

python benchmarks/bench_syncs.py [--steps 200] [--rounds 5] [--out bench-results/syncs.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from sidecar.syncs import SyncDetector, SyncScan, SyncSpec, SyncWatch  # noqa: E402
from sidecar.syncs.watch import SYNC_WARNING  # noqa: E402


class Block(torch.nn.Module):
    """A Llama-style decoder layer (RMSNorm, attention, SiLU-gated MLP) written with plain ops, so
    each op reaches the dispatcher the way a served model's do."""

    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)
        self.qkv, self.o = torch.nn.Linear(d, 3 * d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.gate_up, self.down = torch.nn.Linear(d, 2 * ff, bias=False), torch.nn.Linear(ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        a = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(torch.nn.functional.silu(gate) * up)


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int = 2048, d: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, 4, 256) for _ in range(layers))
        self.norm, self.head = torch.nn.RMSNorm(d), torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, -1]))


def make_model() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return TinyLM().eval(), torch.randint(0, 2048, (8, 16))


class _Bare(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def ops_per_step(model, x) -> int:
    counter = _Count()
    with torch.inference_mode(), counter:
        model(x)
    return counter.ops


def time_steps(step, steps: int, begin=None, end=None) -> list[float]:
    out = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if begin:
            begin()
        step()
        if end:
            end()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def run_mode(mode: str, model, x, steps: int) -> list[float]:
    step = lambda: model(x)  # noqa: E731
    with torch.inference_mode():
        if mode == "none":
            return time_steps(step, steps)
        if mode == "bare_mode":
            with _Bare():
                return time_steps(step, steps)
        if mode == "disarmed":
            # Armed and never begun: the sidecar's begin(start_step) has not come.
            scan = SyncScan(SyncSpec(id="bench", steps=1), lambda msg: None, detector=SyncDetector(treat_cpu_as_device=False))
            number = iter(range(10**9))
            return time_steps(step, steps, lambda: scan.on_step_begin(True, next(number)), lambda: scan.on_step_end(True))
        detector = SyncDetector(treat_cpu_as_device=mode == "armed_cpu")
        detector.arm()
        counter = iter(range(10**9))
        try:
            return time_steps(step, steps, lambda: detector.step_begin(next(counter)), detector.step_end)
        finally:
            detector.disarm()
            assert not detector.stats(), "the benchmark loop must have no syncs"


def per_sync_cost(n: int = 2000) -> dict:
    x = torch.randn(16)
    with torch.inference_mode():
        t0 = time.perf_counter()
        for _ in range(n):
            x.sum().item()
        bare = (time.perf_counter() - t0) / n * 1e6
        detector = SyncDetector(treat_cpu_as_device=True)
        detector.arm()
        detector.step_begin(0)
        t0 = time.perf_counter()
        for _ in range(n):
            x.sum().item()
        armed = (time.perf_counter() - t0) / n * 1e6
        detector.step_end()
        detector.disarm()
    return {"bare_us": round(bare, 2), "armed_us": round(armed, 2), "cost_us": round(armed - bare, 2)}


class _StandInSwitch:
    """torch.cuda's get/set_sync_debug_mode, for a machine without CUDA."""

    mode = 0

    def get(self) -> int:
        return self.mode

    def set(self, mode: int) -> None:
        self.mode = mode


def watch_cost(n: int = 20000) -> dict:
    import warnings

    def timed(fn) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    switch = _StandInSwitch()
    idle = SyncWatch(switch, every=10**9)
    idle.install()
    try:
        step = iter(range(10**9))
        bare_step = timed(lambda: None)
        unsampled = timed(lambda: (idle.step_begin(True, next(step)), idle.step_end()))
    finally:
        idle.uninstall()
    watch = SyncWatch(switch, every=1)
    watch.install()
    try:
        watch.step_begin(True, 0)
        per_sync = timed(lambda: warnings.warn(SYNC_WARNING, UserWarning))
        watch.step_end()
        sampled = timed(lambda: (watch.step_begin(True, 1), watch.step_end()))
    finally:
        watch.uninstall()
    assert watch.report()["sites"], "the watch must have seen the syncs"
    return {
        "unsampled_step_us": round(unsampled - bare_step, 3),
        "sampled_step_us": round(sampled - bare_step, 3),
        "per_sync_us": round(per_sync, 2),
    }


def watch_cost_cuda(n: int = 5000) -> dict | None:
    """A real sync (``.item()`` of a 1024-element CUDA tensor) bare and inside a step the watch samples."""
    if not torch.cuda.is_available():
        return None
    x = torch.ones(1024, device="cuda")

    def timed() -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x.sum().item()
        return (time.perf_counter() - t0) / n * 1e6

    timed()  # warm-up: kernels loaded, allocator primed
    watch = SyncWatch(every=1)
    watch.install()
    try:
        bare = timed()
        watch.step_begin(True, 0)
        watched = timed()
        watch.step_end()
    finally:
        watch.uninstall()
    assert watch.report()["sites"], "the watch must have seen the syncs"
    return {"device": torch.cuda.get_device_name(), "bare_item_us": round(bare, 2), "watched_item_us": round(watched, 2),
            "per_sync_us": round(watched - bare, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "bench-results" / "syncs.json")
    args = p.parse_args(argv)

    torch.set_num_threads(1)
    model, x = make_model()
    modes = ("none", "disarmed", "armed", "armed_cpu", "bare_mode")
    # Arm and disarm once first, so "disarmed" and "none" run after a scan was removed again.
    for mode in modes:
        run_mode(mode, model, x, 20)
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else reversed(modes):
            samples[mode] += run_mode(mode, model, x, args.steps)
    median = {m: statistics.median(v) for m, v in samples.items()}
    ops = ops_per_step(model, x)
    result = {
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "threads": 1, "cpu": platform.processor() or platform.machine()},
        "workload": "2-layer Llama-style model, hidden 128, vocab 2048, batch 8x16 tokens, inference_mode",
        "steps_per_mode": len(samples["none"]),
        "aten_ops_per_step": ops,
        "median_step_us": {m: round(v, 1) for m, v in median.items()},
        "ratio_to_none": {m: round(median[m] / median["none"], 4) for m in modes},
        "per_op_cost_us": {m: round((median[m] - median["none"]) / ops, 2) for m in ("armed", "armed_cpu", "bare_mode")},
        "per_sync": per_sync_cost(),
        "watch_stand_in": watch_cost(),
        "watch_cuda": watch_cost_cuda(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"step time (median of {result['steps_per_mode']} steps, {ops} aten ops/step):")
    for m in modes:
        print(f"  {m:10s} {median[m]:9.1f} us   x{result['ratio_to_none'][m]:.3f}")
    cost = result["per_op_cost_us"]
    print(f"per aten op while armed: {cost['armed']} us (armed_cpu {cost['armed_cpu']} us; an empty dispatch mode {cost['bare_mode']} us)")
    print(f"per .item(): bare {result['per_sync']['bare_us']} us, armed {result['per_sync']['armed_us']} us")
    w = result["watch_stand_in"]
    print(f"always-on watch (stand-in switch): step not sampled {w['unsampled_step_us']} us, sampled step "
          f"{w['sampled_step_us']} us + {w['per_sync_us']} us per sync seen")
    if result["watch_cuda"]:
        c = result["watch_cuda"]
        print(f"always-on watch on {c['device']}: .item() bare {c['bare_item_us']} us, in a sampled step "
              f"{c['watched_item_us']} us ({c['per_sync_us']} us per sync seen)")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
