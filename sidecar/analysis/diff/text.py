"""The readable diff: ``diff_summaries``' dict as text for a terminal, the changes beyond noise first.

Durations and shares are written as the report writes them (sidecar/analysis/text.py); a change carries its sign,
a ratio is B / A (``new`` where A had none, ``gone`` where B has none).
"""

from __future__ import annotations

from ..text import _t as duration  # the report's way of writing a duration
from ..summary import unique_short_names

# The overall figures as a person reads them, and how each is written.
_FIGURES = {
    "step_time_us": ("step time", "us"),
    "gpu_busy_us": ("GPU busy", "us"),
    "gpu_busy_fraction": ("GPU busy share", "fraction"),
    "kernel_count": ("kernels", "count"),
    "kernel_time_us": ("kernel time", "us"),
    "launch_count": ("launches", "count"),
    "launch_us": ("launch CPU time", "us"),
    "memcpy_count": ("memcpy/memset", "count"),
    "memcpy_us": ("memcpy/memset time", "us"),
    "sync_count": ("syncs", "count"),
    "sync_us": ("host blocked in syncs", "us"),
    "gap_count": ("GPU idle gaps", "count"),
    "gap_us": ("GPU idle gap time", "us"),
}
_SECTION_TITLES = {
    "kernels": "Kernels",
    "ops": "CPU ops by self time",
    "syncs": "Synchronisation (host blocked)",
    "gaps": "GPU idle gaps by cause",
}


def format_diff(diff: dict, top: int = 10) -> str:
    """The diff as text; ``top``: changed rows shown per named section (all of them are in the JSON)."""
    lines: list[str] = []
    add = lines.append
    per_step = diff["basis"] == "per_step"
    for key in ("a", "b"):
        side = diff[key]
        steps = ""
        if side["step_mean_us"] is not None:
            spread = f" ± {duration(side['step_stdev_us'])}" if side["step_stdev_us"] is not None else ""
            steps = f" ({side['complete_steps']} complete step{'s' if side['complete_steps'] != 1 else ''}, " \
                    f"{duration(side['step_mean_us'])}/step{spread})"
        add(f"{key.upper()}: {side['source']}{steps}")
        add(f"   {side['headline']}")
    noise = diff["noise"]
    add("")
    if noise["rule"] == "welch":
        add(f"Noise: a change within {noise['z']:g} standard errors of the difference of the step means is noise "
            f"(step time ± {duration(noise['step_band_us'])}, {noise['relative_band'] * 100:.1f}% of A's); marked ~")
    else:
        add("Noise: no run-to-run spread to judge by; only unchanged figures are noise (marked ~)")
    for warning in diff["warnings"]:
        add(f"  note: {warning}")
    add("")
    unit = "per step" if per_step else "per capture"
    add(f"Overall, {unit}{' (means of the complete steps)' if per_step else ''}:")
    add(f"  {'':<22} {'A':>11} {'B':>11} {'change':>11} {'ratio':>8}")
    for row in diff["overall"]:
        label, kind = _FIGURES.get(row["metric"], (row["metric"], "count"))
        add(f"  {label:<22} {_value(row['a'], kind):>11} {_value(row['b'], kind):>11} {_change(row['delta'], kind):>11} "
            f"{_ratio(row['a'], row['b'], row['ratio']):>8}{'  ~' if row['noise'] else ''}")
    for key, title in _SECTION_TITLES.items():
        _section(f"{title}, {unit}", diff[key], key, top, add)
    return "\n".join(lines) + "\n"


def _section(title: str, rows: list[dict], key: str, top: int, add) -> None:
    changed = [r for r in rows if not r["noise"]]
    quiet = len(rows) - len(changed)
    add("")
    if not rows:
        add(f"{title}: none in either")
        return
    if not changed:
        add(f"{title}: no change beyond noise ({quiet} compared)")
        return
    add(f"{title}, largest change first ({len(changed)} changed, {quiet} within noise):")
    add(f"  {'A':>10} {'B':>10} {'change':>11} {'ratio':>8} {'count A → B':>17}  name")
    shown = changed[:top]
    names = unique_short_names([r["name"] for r in shown], 70) if key == "kernels" else {r["name"]: r["name"] for r in shown}
    for r in shown:
        counts = f"{_value(r['a_count'], 'count')} → {_value(r['b_count'], 'count')}"
        add(f"  {_value(r['a_us'], 'us'):>10} {_value(r['b_us'], 'us'):>10} {_change(r['delta_us'], 'us'):>11} "
            f"{_ratio(r['a_us'], r['b_us'], r['ratio']):>8} {counts:>17}  {names[r['name']]}")
    if len(changed) > top:
        add(f"  ... {len(changed) - top} more changed in --json")


def _value(value, kind: str) -> str:
    if value is None:
        return "—"  # outside that capture's top-N list: unknown
    if kind == "us":
        return duration(value)
    if kind == "fraction":
        return f"{value * 100:.1f}%"
    if float(value).is_integer():
        return f"{value:,.0f}"
    return f"{value:,.2f}" if abs(value) < 10 else f"{value:,.1f}"  # a count per step: 0.17 is not 0.2


def _change(delta, kind: str) -> str:
    if delta is None:
        return "?"
    if delta == 0:
        return "0"
    sign = "+" if delta > 0 else "-"
    if kind == "fraction":  # a change of a share is in percentage points, not a share of a share
        return f"{sign}{abs(delta) * 100:.1f} pt"
    return sign + _value(abs(delta), kind)


def _ratio(a, b, ratio) -> str:
    if a is None or b is None:
        return "?"
    if ratio is not None:
        return f"×{ratio:.2f}" if b else "gone"
    return "new" if b else "—"  # nothing in A: B's is new (or both nothing)
