"""A step's phases on the page (docs/analysis.md, "Step anatomy"): a lane of the process's timeline in
which each step is split into its phases, and the section that gives each process's mean per phase.

The summary times each phase per step (``anatomy.processes[].steps[].phases_us``), not where in the
step its ranges lie: a step's mark is therefore cut into its phases in the order a step runs them
(``sidecar/common/phases.py``), each as wide as its time, and the rest of the step (``unphased_us``: for a
step-driven process mostly waiting for the next step) left light. A process whose phases are cut by
another's steps (the API server: ``steps_of``) has no steps of its own to draw them on; the section
gives its figures.
"""

from __future__ import annotations

from ..common.phases import PHASES
from .charts import legend, share_bar
from .markup import duration, esc, table, tag
from .styles import PHASE_COLOURS

ORDER = [name for name, _ in PHASES]
UNPHASED = "unphased"


def entry_for(summary: dict, process: dict) -> dict | None:
    """The anatomy of ``process`` (a summary's ``processes[]`` entry), when it has steps of its own."""
    for entry in (summary.get("anatomy") or {}).get("processes") or []:
        if entry["pid"] == process.get("pid") and entry["process"] == process.get("label") and not entry["steps_of"]:
            return entry
    return None


def phases_lane(steps: list[dict], entry: dict, x, w) -> str:
    """The lane's marks: ``steps`` are the process's (their start on the axis), ``entry`` its anatomy."""
    starts = {s["step"]: s["start_at_us"] for s in steps}
    out = []
    for row in entry["steps"]:
        if row["step"] not in starts:
            continue
        at = starts[row["step"]]
        parts = [(p, row["phases_us"].get(p) or 0.0) for p in ORDER] + [(UNPHASED, row.get("unphased_us") or 0.0)]
        tip = f"step {row['step']}: " + ", ".join(f"{_label(p)} {duration(t)}" for p, t in parts if t > 0)
        marks = []
        for phase, spent in parts:
            if spent <= 0:
                continue
            marks.append(f'<rect x="{x(at):.1f}" y="3" width="{w(spent):.1f}" height="18" '
                         f'fill="{PHASE_COLOURS.get(phase, PHASE_COLOURS[UNPHASED])}"/>')
            at += spent
        out.append(tag("g", tag("title", esc(tip + (" (cut off)" if row.get("partial") else ""))) + "".join(marks),
                       class_="phase-step"))
    return "".join(out)


def phase_legend(summary: dict) -> str:
    seen = (summary.get("anatomy") or {}).get("phases") or {}
    if not seen:
        return ""
    return legend([(f"p-{p}", text) for p, text in seen.items()] + [(f"p-{UNPHASED}", "in no phase")])


def anatomy_section(summary: dict) -> str:
    """Per process: its mean complete step as one bar of phases, and the figures as a table."""
    anatomy = summary.get("anatomy")
    if not anatomy or not anatomy.get("processes"):
        return ""
    parts = [phase_legend(summary)]
    for entry in anatomy["processes"]:
        means = [(p, entry["mean_us"].get(p)) for p in ORDER if entry["mean_us"].get(p) is not None]
        basis = f", during the steps of {entry['steps_of']}" if entry["steps_of"] else ""
        n = entry["complete_steps"]
        head = tag("h3", esc(entry["process"]) + " " + tag(
            "span", esc(f"{n} complete step{'s' if n != 1 else ''}{basis}"), class_="muted"))
        bar = share_bar([(p, t, f"{_label(p)}: {duration(t)} per step") for p, t in means],
                        label=f"mean step of {entry['process']} by phase", colours=PHASE_COLOURS)
        rows = [(esc(_label(p)), duration(entry["mean_us"].get(p)), duration(entry["total_us"].get(p)))
                for p in ORDER if p in entry["total_us"]]
        parts.append(head + bar + table(["phase", "mean per complete step", "total in the window"], rows,
                                        numeric=(1, 2)))
    for b in anatomy.get("between_forwards") or []:
        if b["mean_host_us"] is None:
            continue
        idle = (f"; the device idle {duration(b['mean_device_idle_us'])} of it"
                if b["mean_device_idle_us"] is not None else "")
        parts.append(tag("p", esc(f"{b['process']}: {duration(b['mean_host_us'])} from one forward to the next "
                                  f"(mean){idle}."), class_="note"))
    return tag("section", tag("h2", "Step anatomy (phases)") + "".join(parts), id="anatomy")


def _label(phase: str) -> str:
    return "in no phase" if phase == UNPHASED else next((t for n, t in PHASES if n == phase), phase)
