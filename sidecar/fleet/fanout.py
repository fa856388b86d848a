"""One call per target on a bounded pool of threads: each target's outcome is its result or one line
saying why not, never an exception that stops the others.

Threads, not asyncio: the calls are the blocking HTTP client every other command uses
(sidecar/cli/client.py), and at most ``concurrency`` of them run at once, whatever the fleet's size.
``on_progress`` is called from the caller's thread (at most every ``tick_s``) with how many ended and
how many failed, so a progress line never races the work.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from .targets import Target

R = TypeVar("R")

DEFAULT_CONCURRENCY = 16
MAX_CONCURRENCY = 256


@dataclass(frozen=True)
class Outcome(Generic[R]):
    target: Target
    result: R | None = None
    error: str | None = None  # one line; None when the call returned

    @property
    def ok(self) -> bool:
        return self.error is None


def run_all(targets: Sequence[Target], call: Callable[[Target], R], describe_error: Callable[[BaseException], str],
            *, concurrency: int = DEFAULT_CONCURRENCY,
            on_progress: Callable[[int, int, int], None] | None = None, tick_s: float = 0.2) -> list[Outcome[R]]:
    """``call(target)`` for every target, ``concurrency`` at a time; the outcomes in the targets' order.
    ``describe_error`` makes an exception one line (it decides what a sidecar's refusal looks like);
    ``on_progress(done, failed, total)``."""
    outcomes: dict[int, Outcome[R]] = {}
    workers = max(1, min(concurrency, len(targets), MAX_CONCURRENCY))
    with cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fleet") as pool:
        futures = {pool.submit(call, t): i for i, t in enumerate(targets)}
        pending = set(futures)
        while pending:
            finished, pending = cf.wait(pending, timeout=tick_s, return_when=cf.FIRST_COMPLETED)
            for future in finished:
                i = futures[future]
                exc = future.exception()
                outcomes[i] = (Outcome(targets[i], future.result()) if exc is None
                               else Outcome(targets[i], error=describe_error(exc)))
            if on_progress is not None:
                on_progress(len(outcomes), sum(1 for o in outcomes.values() if not o.ok), len(targets))
    return [outcomes[i] for i in range(len(targets))]


def wait_all(targets: Sequence[Target], poll: Callable[[Target], tuple[bool, R]],
             describe_error: Callable[[BaseException], str], *, deadline_s: float, interval_s: float = 0.5,
             concurrency: int = DEFAULT_CONCURRENCY,
             on_progress: Callable[[int, int, int], None] | None = None) -> list[Outcome[R]]:
    """Poll every target until ``poll(target)`` says it is final (``(True, result)``), one round at a
    time on one bounded pool, so that a thousand waits cost ``concurrency`` threads and every target is
    asked about once per ``interval_s``. A target still not final after ``deadline_s`` (or whose poll
    raises) fails with its last answer's line."""
    ended: dict[Target, Outcome[R]] = {}
    waiting = list(targets)
    stop_at = time.monotonic() + deadline_s
    while waiting:
        began = time.monotonic()
        answers = run_all(waiting, poll, describe_error, concurrency=concurrency)
        still = []
        for o in answers:
            if not o.ok:
                ended[o.target] = o
            elif o.result[0]:
                ended[o.target] = Outcome(o.target, o.result[1])
            else:
                still.append(o.target)
        waiting = still
        if on_progress is not None:
            on_progress(len(ended), sum(1 for o in ended.values() if not o.ok), len(targets))
        if waiting and time.monotonic() > stop_at:
            for t in waiting:
                ended[t] = Outcome(t, error=f"not final after {deadline_s:.0f} s of waiting")
            break
        if waiting:
            time.sleep(max(0.0, interval_s - (time.monotonic() - began)))
    return [ended[t] for t in targets]
