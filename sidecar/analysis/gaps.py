"""Idle gaps on the GPU and what caused each.

A gap is a hole between two consecutive busy intervals (kernel union) of one device, at least
``min_gap_us`` long; shorter holes are ordinary launch spacing. Its cause, tried in this order:

* ``sync``: a synchronising call (see syncs.py) had already started when the GPU went idle, so the
  host was blocked and queued nothing new;
* ``memcpy``: copies ran for at least half of the gap (the GPU waited on a transfer);
* ``launch``: the call that launched the next kernel began before the gap did: the work was being
  submitted and the gap is launch latency (a CPU-bound launch path, many tiny kernels);
* ``host``: that call began only after the GPU went idle: the host was busy elsewhere (Python,
  scheduling, tokenisation, ...); ``detail`` names the op that finally launched the work;
* ``unknown``: the next kernel has no matching launch in the trace.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional, Sequence

from . import intervals
from .events import Kind
from .kernels import GpuStats, us
from .processes import ProcessView
from .syncs import SyncFinding

MIN_GAP_US = 10.0
CAUSES = ("sync", "memcpy", "launch", "host", "unknown")


@dataclass
class Gap:
    device: int
    start: float
    end: float
    cause: str
    preceded_by: str
    followed_by: str
    step: Optional[int]
    next_activity: int  # index (in the process's GPU activities) of the kernel that ended the gap
    sync: Optional[SyncFinding] = None
    detail: str = ""  # filled for the largest gaps only (see describe)

    @property
    def dur(self) -> float:
        return self.end - self.start


def find_gaps(view: ProcessView, stats: GpuStats, syncs: Sequence[SyncFinding], min_gap_us: float = MIN_GAP_US, describe_top: int = 10) -> list[Gap]:
    """All gaps of at least ``min_gap_us`` on the devices of one process, with their cause; the
    ``describe_top`` largest also get ``detail`` (naming ops costs a walk up the call tree)."""
    gpu = view.gpu
    names = view.data.names
    kernels_by_device: dict[int, list[tuple[float, float, int]]] = defaultdict(list)  # (start, end, k)
    copies_by_device: dict[int, list[intervals.Interval]] = defaultdict(list)
    for k, i in enumerate(view.gpu_index):
        start = gpu.ts[i]
        if gpu.kind[i] == Kind.KERNEL:
            kernels_by_device[gpu.device[i]].append((start, start + gpu.dur[i], k))
        else:
            copies_by_device[gpu.device[i]].append((start, start + gpu.dur[i]))
    sync_list = sorted(syncs, key=lambda f: f.ts)
    sync_starts = [f.ts for f in sync_list]
    found: list[Gap] = []
    for device, busy in stats.device_busy.items():
        kernels = sorted(kernels_by_device[device])
        kernel_starts = [kern[0] for kern in kernels]
        kernel_ends = sorted((kern[1], kern[2]) for kern in kernels)
        copies = intervals.union(copies_by_device.get(device, ()))
        copy_starts = [start for start, _ in copies]
        for gap_start, gap_end in intervals.gaps(busy):
            if gap_end - gap_start < min_gap_us:
                continue
            nxt = kernels[bisect_left(kernel_starts, gap_end)][2]
            prv = kernel_ends[min(len(kernel_ends) - 1, bisect_left(kernel_ends, (gap_start, -1)))][1]
            sync = _blocking_sync(sync_list, sync_starts, gap_start)
            if sync is not None:
                cause = "sync"
            elif copies and intervals.covered(copies, copy_starts, gap_start, gap_end) >= 0.5 * (gap_end - gap_start):
                cause = "memcpy"
            elif view.launch_tid[nxt] is None:
                cause = "unknown"
            else:
                cause = "launch" if view.launch_ts[nxt] <= gap_start else "host"
            found.append(
                Gap(
                    device=device,
                    start=gap_start,
                    end=gap_end,
                    cause=cause,
                    preceded_by=names[gpu.name[view.gpu_index[prv]]],
                    followed_by=names[gpu.name[view.gpu_index[nxt]]],
                    step=view.step_at(view.launch_ts[nxt]),
                    next_activity=nxt,
                    sync=sync,
                )
            )
    for gap in sorted(found, key=lambda g: -g.dur)[:describe_top]:
        gap.detail = describe(view, gap)
    return found


def _blocking_sync(sync_list: Sequence[SyncFinding], sync_starts: list[float], gap_start: float) -> Optional[SyncFinding]:
    """A sync that began before the GPU went idle and was still blocking when it did."""
    k = bisect_right(sync_starts, gap_start) - 1
    while k >= 0:
        f = sync_list[k]
        if f.ts + f.dur >= gap_start:
            return f
        if gap_start - f.ts > 10_000_000:  # 10 s: no call blocks longer; stop looking back
            return None
        k -= 1
    return None


def describe(view: ProcessView, gap: Gap) -> str:
    """What to look at: the sync and its call site, or the call that launched the next kernel
    and the op (or Python frame) it was made from."""
    if gap.sync is not None:
        return f"{gap.sync.name} in {gap.sync.python or gap.sync.site or 'top level'}"
    tid = view.launch_tid[gap.next_activity]
    if tid is None or gap.cause == "memcpy":
        return ""
    index = view.launch_index[gap.next_activity]
    site, python, _stack = view.enclosing(tid, index)
    where = python or site or "top level"
    if gap.cause == "launch":
        return f"{view.data.names[view.threads[tid].name[index]]} in {where}"
    return f"next launch from {where}"


def summarize(items: Sequence[tuple[Gap, float, str]], top_n: int, min_gap_us: float = MIN_GAP_US) -> dict:
    """The ``gaps`` object. ``items``: (gap, start of its process's window, process label)."""
    by_cause = {cause: {"count": 0, "total_us": 0.0} for cause in CAUSES}
    for gap, _origin, _label in items:
        entry = by_cause[gap.cause]
        entry["count"] += 1
        entry["total_us"] += gap.dur
    for entry in by_cause.values():
        entry["total_us"] = us(entry["total_us"])
    largest = sorted(items, key=lambda item: -item[0].dur)[:top_n]
    return {
        "min_gap_us": min_gap_us,
        "count": len(items),
        "total_us": us(sum(gap.dur for gap, _o, _l in items)),
        "by_cause": by_cause,
        "largest": [
            {
                "process": label,
                "device": g.device,
                "at_us": us(g.start - origin),
                "dur_us": us(g.dur),
                "cause": g.cause,
                "detail": g.detail,
                "preceded_by": g.preceded_by,
                "followed_by": g.followed_by,
                "step": g.step,
            }
            for g, origin, label in largest
        ],
    }
