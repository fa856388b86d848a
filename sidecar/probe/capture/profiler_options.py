"""What torch.profiler records in one process for a capture's spec: the choice of options.

A capture's spec says what the user asked (stacks, module hierarchy, shapes, FLOPs, memory); each
process decides what it can honour in its role (``Role.traced_stacks``: only the one that runs the
model affords torch's Python tracer), whether it records one profiler session or one per step, how
its stack sampler is bounded, and builds the ``torch.profiler.profile`` itself (profiler.py runs it).
"""

from __future__ import annotations

from ...engine import Role
from ...common.protocol import CaptureSpec
from .limits import ProbeLimits
from ...stacks.sampler import StackSampler


def module_mode(spec: CaptureSpec, role: Role) -> bool:
    """Whether this process records torch.profiler's module hierarchy for ``spec``. torch (2.13
    measured) writes its ``nn.Module: <Class>_<n>`` ranges only from its Python tracer: with
    ``with_modules`` alone the trace holds none. So only a role that can afford the tracer
    (``Role.traced_stacks``: the one that runs the model) honours it; the others have no model."""
    return spec.with_modules and role.traced_stacks


def stack_mode(spec: CaptureSpec, role: Role) -> str:
    """The Python stacks this process records for ``spec``: "none", "sampled" or "traced" (only in
    a role that allows torch.profiler's tracer; sampled in any other). Where the module hierarchy is
    recorded the tracer runs anyway, so the stacks are "traced" (a sampler on top would only add
    cost), and the report says so."""
    if module_mode(spec, role):
        return "traced"
    if spec.stacks == "none":
        return "none"
    return "traced" if spec.stacks == "traced" and role.traced_stacks else "sampled"


# The highest rate at which a window capture (the API server) samples its event loop's thread,
# whatever ``stack_hz`` asks. Every sample takes the GIL; while the loop runs Python (streaming
# tokens) the sampler gets it only by forcing a switch, and each forced switch costs the loop two
# wakeups by the OS: cheap on an idle host, up to tens of ms each on a loaded one (measured at
# 1 kHz on a 2-core host at load 10-18: the sampler waited up to 1.2 s for the GIL and the loop's
# worst delay was 1.5 s, docs/benchmarks.md). The loop mostly waits in epoll (GIL released), so
# its stacks need far fewer samples than a step thread's; 50 Hz bounds the forced switches at 50
# a second where 1 kHz made them 200 (one per switch interval).
WINDOW_MAX_STACK_HZ = 50.0


def records_in_parts(spec: CaptureSpec, stacks: str) -> bool:
    """Whether a step-driven process records ``spec`` as one torch.profiler session per step
    (trace_parts.py says why): where ``stop()`` has much to do per op (shapes, FLOPs, memory
    records). A plain capture's stop is cheap (about 5 ms a step on vLLM's worker) and keeps one
    session: no restart, no device synchronisation per step. Nor does torch's tracer (traced stacks,
    module ranges): restarted at every step it made every recorded step of vLLM's worker 150-200 ms
    slower on a 2-core host, worse than its one stop (docs/benchmarks.md, issue 15)."""
    heavy = spec.record_shapes or spec.with_flops or spec.profile_memory
    return heavy and stacks != "traced" and spec.steps > 1


def make_sampler(spec: CaptureSpec, limits: ProbeLimits | None, max_hz: float | None = None) -> StackSampler:
    """The sampler of one capture, bounded by the probe's byte limit: the slices built from its
    samples may take at most a quarter of what the whole trace may (``StackSampler`` counts their
    estimated bytes while it samples). ``max_hz``: this process's cap on ``spec.stack_hz`` (the
    samples file and the summary say the rate used)."""
    bounds = {} if limits is None else {"max_bytes": max(1, min(limits.max_trace_bytes // 4, 32 << 20))}
    hz = spec.stack_hz if max_hz is None else min(spec.stack_hz, max_hz)
    return StackSampler(hz=hz, name=f"inference-sidecar-stacks-{spec.id}", **bounds)


def make_profiler(spec: CaptureSpec, cuda_available: bool, with_stack: bool = False, with_modules: bool = False):
    """A torch.profiler.profile that records every step it is given (start/step/stop by hand).
    ``with_stack``: torch's tracer-based stacks (``stack_mode`` decides); ``with_modules``: the
    module hierarchy (``module_mode`` decides; it needs ``with_stack``)."""
    import torch.profiler as tp

    wanted = spec.activities or (("cpu", "cuda") if cuda_available else ("cpu",))
    acts = [tp.ProfilerActivity.CPU if a == "cpu" else tp.ProfilerActivity.CUDA for a in wanted]
    return tp.profile(
        activities=acts,
        experimental_config=None if with_stack else _trace_only(),
        # A schedule makes torch emit its ProfilerStep#<n> annotations; always RECORD so that
        # start/step/stop alone decide what is recorded.
        schedule=lambda _step: tp.ProfilerAction.RECORD,
        record_shapes=spec.record_shapes,
        with_stack=with_stack,
        profile_memory=spec.profile_memory,
        with_flops=spec.with_flops,
        with_modules=with_modules,
    )


def _trace_only():
    """torch.profiler's ``trace_only``: ``stop()`` skips what only ``events()`` and
    ``key_averages()`` need, which a capture never calls (it exports the trace). Measured on the
    stop of 5 steps with record_shapes, profile_memory and with_flops: 5-15 % of its CPU time
    (``benchmarks/bench_profiler_stop.py``). torch refuses it with the tracer (``with_stack``); a
    torch without it gets None (its default)."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(trace_only=True)
    except (ImportError, TypeError):
        return None
