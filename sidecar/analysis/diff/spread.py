"""How much a capture's figures vary from one step to the next: what ``sidecar diff`` calls noise.

A capture's steps repeat the same work, so their spread is the best estimate of how much any figure
would move between two runs that changed nothing. Each complete engine step gives one sample of each
per-step figure (summed over the processes that record it, the wall time averaged over them); the
mean of those samples is what a diff compares.

The rule (docs/analysis.md, "Noise"): the difference of two means is noise when it is within
``NOISE_Z`` standard errors of the difference, Welch's ``sqrt(s_a²/n_a + s_b²/n_b)``: about a 95 %
band for a handful of steps, the usual two-sided test without assuming equal spreads. A figure with
no per-step samples (one kernel's time, one op's) has its change compared with the step time's band
as a share of the step time (``relative_band``): the steps' spread sets how precisely any per-step
figure of the capture is known.
"""

from __future__ import annotations

import math
from typing import Optional

from ..summary import engine_step_rows

NOISE_Z = 2.0
MIN_STEPS = 2  # a spread needs two complete steps in each capture

# Per-step figures of a step row that a diff compares (docs/analysis.md, steps[]), summed over processes.
SUMMED = ("gpu_busy_us", "kernel_count", "kernel_time_us", "launch_count", "launch_us", "memcpy_count",
          "memcpy_us", "sync_count", "sync_us", "gap_count", "gap_us")
STEP_TIME = "step_time_us"
BUSY_FRACTION = "gpu_busy_fraction"
# In the order a diff lists them: the step time first, then the GPU, the host, the waits.
FIGURES = (STEP_TIME, "gpu_busy_us", BUSY_FRACTION, "kernel_count", "kernel_time_us", "launch_count", "launch_us",
           "memcpy_count", "memcpy_us", "sync_count", "sync_us", "gap_count", "gap_us")


def step_samples(summary: dict) -> tuple[int, dict[str, list[float]]]:
    """(engine steps, {figure: one value per complete engine step, in step order}); ({} when none).

    Engine steps are counted as the headline counts them (``engine_step_rows``); the cut-off last step
    is left out of the samples, as it is of the headline's mean."""
    if not summary.get("steps"):
        return 0, {}
    count, rows = engine_step_rows(summary["steps"])
    by_number: dict[int, list[dict]] = {}
    for row in rows:
        if not row.get("partial"):
            by_number.setdefault(row["step"], []).append(row)
    samples: dict[str, list[float]] = {name: [] for name in FIGURES}
    for number in sorted(by_number):
        group = by_number[number]
        samples[STEP_TIME].append(sum(r["wall_us"] for r in group) / len(group))
        for name in SUMMED:
            samples[name].append(float(sum(r[name] for r in group)))
        span = sum(r["gpu_span_us"] for r in group)
        samples[BUSY_FRACTION].append(samples["gpu_busy_us"][-1] / span if span > 0 else 0.0)
    return count, samples


def mean(values: list[float]) -> float:
    return math.fsum(values) / len(values)


def stdev(values: list[float]) -> float:
    """Sample standard deviation (n - 1): the steps are a sample of the run's steps."""
    m = mean(values)
    return math.sqrt(math.fsum((v - m) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0


def band(a: list[float], b: list[float]) -> Optional[float]:
    """``NOISE_Z`` standard errors of mean(b) - mean(a), or None with fewer than MIN_STEPS samples on a side."""
    if len(a) < MIN_STEPS or len(b) < MIN_STEPS:
        return None
    return NOISE_Z * math.sqrt(stdev(a) ** 2 / len(a) + stdev(b) ** 2 / len(b))


def relative_band(a: list[float], b: list[float]) -> Optional[float]:
    """The step time's band as a share of capture A's mean step time: the noise band of the figures
    without per-step samples, each scaled by its own size."""
    width = band(a, b)
    if width is None:
        return None
    base = mean(a)
    return width / base if base > 0 else None
