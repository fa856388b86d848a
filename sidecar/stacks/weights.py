"""How much of the target's time each stack sample stands for (the sampled-stacks summary ranks
frames by it, sampled.py). Pure functions of the samples' times and GIL waits, and of the GIL
switch interval of the process that was sampled (the samples file carries it)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

DEFAULT_SWITCH_INTERVAL_S = 0.005  # sys.getswitchinterval()'s default


def weight_cap(period_ns: int, switch_interval_s: float = DEFAULT_SWITCH_INTERVAL_S) -> int:
    """The most time one sample stands for: a hundred periods, and at least twenty GIL switch
    intervals (100 ms at the defaults). Long gaps are mostly real: the sampler waits a switch
    interval or more for the GIL while the target runs Python, longer on a busy host, and as
    long as a C call that keeps the GIL lasts; the sample that ends such a wait sees the code
    that held the GIL. A cap of 10 ms lost a third of a 15 ms pure-Python stretch."""
    return max(100 * period_ns, int(20e9 * switch_interval_s))


def sample_weights(times: Sequence[int], waits: Sequence[int], segments: Iterable[Any], period: int,
                   switch_interval_s: float = DEFAULT_SWITCH_INTERVAL_S) -> list[int]:
    """Per sample, the time it stands for, from the stretch between it and the previous sample
    of its segment, or since ``start()`` for the first (each sample's share capped).

    That stretch is a sleep until the tick the sample was due at, then a wait for the GIL, and
    how long the wait was says who held the GIL at the tick:

    * a whole switch interval or more: the target ran Python and the interpreter had to force
      the switch: the code seen at the sample held the GIL; the stretch goes to it;
    * a noticeable wait (a quarter period, at least 200 µs) cut short: the target was running
      Python at the tick and then released the GIL by itself, entering the blocking call seen
      at the sample; the code before that call is the previous sample's; the stretch goes to
      the previous sample;
    * no real wait: the target was in a call that releases the GIL; the stretch is split
      between both samples.

    Measured on alternating 15 ms halves of pure Python and GIL-releasing waits (truth: 50 %
    each), the Python half got: by sample count 10-20 %; the time until the next sample 25 %;
    since the previous sample 38-46 %; this rule 48-52 %.

    ``times``: each sample's monotonic ns; ``waits``: ns from the tick it was due at to the sample;
    ``segments``: objects with ``lo``, ``hi`` (sample index range) and ``start_ns`` (when sampling
    started, or None); ``period``: the sampling period in ns; ``switch_interval_s``: the sampled
    process's ``sys.getswitchinterval()``."""
    cap = weight_cap(period, switch_interval_s)
    forced = int(0.9e9 * switch_interval_s)
    contended = max(200_000, period // 4)
    weights = [0] * len(times)
    for seg in segments:
        if seg.hi <= seg.lo:
            continue
        first = times[seg.lo]
        weights[seg.lo] = first - seg.start_ns if seg.start_ns is not None and seg.start_ns <= first else period
        for i in range(seg.lo + 1, seg.hi):
            gap = times[i] - times[i - 1]
            wait = waits[i]
            if wait >= forced:
                weights[i] += gap
            elif wait >= contended:
                weights[i - 1] += gap
            else:
                half = gap // 2
                weights[i - 1] += half
                weights[i] += gap - half
        for i in range(seg.lo, seg.hi):
            if weights[i] > cap:
                weights[i] = cap
    return weights
