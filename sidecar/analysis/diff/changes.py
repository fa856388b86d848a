"""``diff_summaries``: two summaries (``analyze_path``'s dicts) in, what changed from A to B out.

The before/after view of a performance change: the per-step figures (step time, GPU busy, kernels,
launches, copies, syncs, gaps), then per kernel, per CPU op, per sync API and per gap cause, each with
A, B, the delta (B - A) and the ratio (B / A), named rows ordered by absolute change, and a change
within the steps' run-to-run spread flagged as noise (spread.py says how). The layout is documented
field by field in docs/analysis.md, "sidecar diff".

Only the summaries are read, never the traces again: a capture's stored summary.json diffs as it is.
Its lists then hold the top N names only, so a name missing from a list that does not hold every name
has no figure on that side (null, and ``unlisted`` says which side), rather than a false zero.
"""

from __future__ import annotations

from typing import Optional

from . import spread
from ..questions.kernels import us

SCHEMA_VERSION = 1
PER_STEP, PER_CAPTURE = "per_step", "per_capture"
# The named sections: key of the diff -> (its list in a summary, the list's time field, the total count the
# list was cut from: None where the summary always lists every name).
_SECTIONS = {
    "kernels": (lambda s: s["gpu"]["top_kernels"], "total_us", lambda s: s["gpu"]["kernel_count"]),
    "ops": (lambda s: s["cpu"]["top_ops"], "self_us", lambda s: s["cpu"]["op_count"]),
    "syncs": (lambda s: s["syncs"], "total_us", lambda s: None),
    "gaps": (lambda s: [{"name": c, **v} for c, v in s["gaps"]["by_cause"].items()], "total_us", lambda s: None),
}


def diff_summaries(a: dict, b: dict) -> dict:
    """What changed from summary ``a`` (before) to ``b`` (after)."""
    steps_a, samples_a = spread.step_samples(a)
    steps_b, samples_b = spread.step_samples(b)
    times_a, times_b = samples_a.get(spread.STEP_TIME, []), samples_b.get(spread.STEP_TIME, [])
    warnings: list[str] = []
    # Per step when both captures have a complete step: captures of different lengths then compare.
    per_step = bool(times_a) and bool(times_b)
    if per_step:
        values_a = {k: spread.mean(v) for k, v in samples_a.items()}
        values_b = {k: spread.mean(v) for k, v in samples_b.items()}
        relative = spread.relative_band(times_a, times_b)
        step_band = spread.band(times_a, times_b)
        divisors = (steps_a, steps_b)
        if step_band is None:
            few = _sides(len(times_a) < spread.MIN_STEPS, len(times_b) < spread.MIN_STEPS)
            warnings.append(f"fewer than {spread.MIN_STEPS} complete steps in {few}: no run-to-run spread, "
                            "so only unchanged figures are noise")
    else:
        values_a, values_b = capture_figures(a), capture_figures(b)
        relative = step_band = None
        divisors = (1, 1)
        warnings.append(f"no complete ProfilerStep in {_sides(not times_a, not times_b)}: figures are per capture "
                        "(captures of different lengths differ by that alone), and only unchanged figures are noise")
    out = {
        "schema_version": SCHEMA_VERSION,
        "a": _side(a, steps_a, times_a),
        "b": _side(b, steps_b, times_b),
        "basis": PER_STEP if per_step else PER_CAPTURE,
        "noise": {
            "rule": "welch" if relative is not None else "unchanged_only",
            "z": spread.NOISE_Z,
            "step_band_us": _round(step_band, spread.STEP_TIME),
            "relative_band": round(relative, 4) if relative is not None else None,
        },
        "overall": _overall(values_a, values_b, samples_a if per_step else {}, samples_b if per_step else {}),
    }
    complete = {key: (_complete(listed(a), total(a)), _complete(listed(b), total(b)))
                for key, (listed, _field, total) in _SECTIONS.items()}
    for key, (listed, time_key, _total) in _SECTIONS.items():
        out[key] = _named(listed(a), listed(b), time_key, complete[key], divisors, relative)
    for n, side in enumerate("AB"):
        cut = [key for key, both in complete.items() if not both[n]]
        if cut:
            warnings.append(f"{side}'s summary lists only its top {' and '.join(cut)}: a name outside them has no "
                            "figure on that side (null); a diff of the trace files compares every name")
    out["warnings"] = warnings
    return out


def capture_figures(summary: dict) -> dict[str, float]:
    """The overall figures of a whole capture, for captures without steps to compare per step."""
    gpu, copies = summary["gpu"], summary["gpu"]["memcpy"].values()
    return {
        "gpu_busy_us": gpu["busy_us"], "gpu_busy_fraction": gpu["busy_fraction"],
        "kernel_count": gpu["kernel_count"], "kernel_time_us": gpu["kernel_time_us"],
        "launch_count": summary["launches"]["count"], "launch_us": summary["launches"]["total_us"],
        "memcpy_count": sum(c["count"] for c in copies), "memcpy_us": sum(c["total_us"] for c in copies),
        "sync_count": sum(s["count"] for s in summary["syncs"]), "sync_us": sum(s["total_us"] for s in summary["syncs"]),
        "gap_count": summary["gaps"]["count"], "gap_us": summary["gaps"]["total_us"],
    }


def _sides(in_a: bool, in_b: bool) -> str:
    return "A and B" if in_a and in_b else "A" if in_a else "B"


def _side(summary: dict, steps: int, times: list[float]) -> dict:
    return {
        "source": summary["source"]["path"],
        "headline": summary["headline"],
        "steps": steps,
        "complete_steps": len(times),
        "step_mean_us": us(spread.mean(times)) if times else None,
        "step_stdev_us": us(spread.stdev(times)) if len(times) > 1 else None,
        "all_names": all(_complete(listed(summary), total(summary)) for listed, _field, total in _SECTIONS.values()),
    }


def _complete(rows: list[dict], total: Optional[int]) -> bool:
    """Whether a summary's list holds every name: its counts add up to the total it was cut from."""
    return total is None or sum(r["count"] for r in rows) >= total


def _round(value: Optional[float], figure: str) -> Optional[float]:
    if value is None:
        return None
    return round(value, 4) if figure.endswith("fraction") else us(value)


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return round(b / a, 4) if a and b is not None else None


def _noise(delta: float, width: Optional[float]) -> bool:
    """Unchanged is always noise; a change is noise when within the band, where there is one."""
    return delta == 0 or (width is not None and abs(delta) <= width)


def _overall(values_a: dict, values_b: dict, samples_a: dict, samples_b: dict) -> list[dict]:
    # A fixed order (step time first), not by size: the figures are in different units.
    rows = []
    for name in spread.FIGURES:
        if name not in values_a or name not in values_b:
            continue
        x, y = values_a[name], values_b[name]
        width = spread.band(samples_a[name], samples_b[name]) if samples_a and samples_b else None
        rows.append({"metric": name, "a": _round(x, name), "b": _round(y, name), "delta": _round(y - x, name),
                     "ratio": _ratio(x, y), "band": _round(width, name), "noise": _noise(y - x, width)})
    return rows


def _named(rows_a: list[dict], rows_b: list[dict], time_key: str, complete: tuple[bool, bool],
           divisors: tuple[int, int], relative: Optional[float]) -> list[dict]:
    """One row per name of either list, per step (``divisors``: each capture's engine steps, or 1),
    the largest absolute change of time first; rows with a side unknown last."""
    by_a = {r["name"]: r for r in rows_a}
    by_b = {r["name"]: r for r in rows_b}
    known, unknown = [], []
    for name in dict.fromkeys([*by_a, *by_b]):
        sides = []
        for by, whole, div in ((by_a, complete[0], divisors[0]), (by_b, complete[1], divisors[1])):
            row = by.get(name)
            if row is not None:
                sides.append((row[time_key] / div, row["count"] / div))
            else:  # absent from a list of every name: it never ran there
                sides.append((0.0, 0.0) if whole else None)
        (ta, ca), (tb, cb) = [s if s is not None else (None, None) for s in sides]
        if ta == tb == ca == cb == 0:
            continue  # a gap cause neither capture had
        entry = {"name": name, "a_us": _r(ta), "b_us": _r(tb), "delta_us": None, "ratio": _ratio(ta, tb),
                 "a_count": _r(ca), "b_count": _r(cb), "delta_count": None, "count_ratio": _ratio(ca, cb),
                 "noise": False, "unlisted": "a" if ta is None else "b" if tb is None else None}
        if ta is None or tb is None:
            unknown.append(entry)
            continue
        dt, dc = tb - ta, cb - ca
        entry["delta_us"], entry["delta_count"] = us(dt), us(dc)
        time_band = relative * max(ta, tb) if relative is not None else None
        count_band = relative * max(ca, cb) if relative is not None else None
        entry["noise"] = _noise(dt, time_band) and _noise(dc, count_band)
        known.append(entry)
    known.sort(key=lambda e: (-abs(e["delta_us"]), -abs(e["delta_count"]), e["name"]))
    unknown.sort(key=lambda e: (-(e["a_us"] if e["a_us"] is not None else e["b_us"]), e["name"]))
    return known + unknown


def _r(value: Optional[float]) -> Optional[float]:
    """Times and per-step counts alike to 3 decimals (a count per step may be a fraction)."""
    return us(value) if value is not None else None
