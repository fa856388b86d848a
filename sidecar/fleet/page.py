"""The fleet's comparison as one HTML page, in the report's style (sidecar/report: its document, its
style sheet, every text through ``esc``): the outlier first, then one row per replica, then the
targets that did not answer. A replica's capture links to its own report on its sidecar.
"""

from __future__ import annotations

from typing import Any

from ..report.document import page
from ..report.markup import esc, percent, table, tag
from .compare import MEASURE, describe_outlier


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} ms"


def render_fleet_page(answer: dict[str, Any], *, kind: str) -> str:
    """``answer``: the ``--json`` answer of ``sidecar fleet capture`` (``kind="capture"``) or
    ``sidecar fleet recorder`` (``kind="recorder"``)."""
    replicas, failed, found = answer["replicas"], answer["failed"], answer.get("outlier")
    flagged = found["target"] if found else None
    with_measure = sum(1 for r in replicas if r.get(MEASURE) is not None)
    parts = [tag("p", esc(describe_outlier(found, with_measure, answer.get("outlier_ratio") or 1.25)),
                 class_="headline")]
    if kind == "capture":
        headers = ["replica", "capture", "state", "steps", "step time", "GPU busy", "top kernel or op", "syncs",
                   "TTFT p99"]
        rows = [[_target_cell(r, flagged), _capture_link(r), tag("span", esc(r.get("state")), class_=f"state state-{r.get('state')}"),
                 esc(r.get("steps") if r.get("steps") is not None else "–"), esc(_ms(r.get(MEASURE))),
                 esc(percent(r.get("gpu_busy"))) if r.get("gpu_busy") is not None else "CPU only",
                 tag("span", esc(r.get("top") or "–"), class_="mono"),
                 esc("–" if r.get("syncs") is None else f"{r['syncs']:,} ({r.get('sync_blocked_ms') or 0:.2f} ms)"),
                 esc(_ms(r.get("ttft_p99_ms")))] for r in replicas]
        numeric = (3, 4, 5, 7, 8)
        skew = answer.get("skew_ms")
        subtitle = (f"fleet {answer.get('fleet_id')} · {len(replicas)} replicas · "
                    f"{answer.get('steps')} steps each · start skew {'–' if skew is None else f'{skew:.0f} ms'}")
    else:
        headers = ["replica", "working steps", "step time", "step p99", "slowest step", "GC on the step thread",
                   "requests", "TTFT p99"]
        rows = [[_target_cell(r, flagged), esc(f"{r.get('steps') or 0:,}"), esc(_ms(r.get(MEASURE))),
                 esc(_ms(r.get("step_p99_ms"))), esc(_ms(r.get("slowest_step_ms"))),
                 esc(_ms(r.get("gc_step_thread_ms"))), esc(r.get("requests_finished") if r.get("requests_finished") is not None else "–"),
                 esc(_ms(r.get("ttft_p99_ms")))] for r in replicas]
        numeric = (1, 2, 3, 4, 5, 6, 7)
        subtitle = f"flight recorders, the last {answer.get('seconds'):g} s · {len(replicas)} replicas"
    parts.append(tag("section", tag("h2", "Replicas") + table(headers, rows, numeric=numeric)))
    if failed:
        items = "".join(tag("li", tag("span", esc(f["target"]), class_="mono") + " " + esc(f["error"])) for f in failed)
        parts.append(tag("section", tag("h2", f"Not answered ({len(failed)})") + tag("ul", items, class_="warn")))
    parts.append(tag("p", esc(f"The outlier: the replica whose step time is farthest from the median by ratio, "
                              f"named at {answer.get('outlier_ratio') or 1.25:g}× or more (docs/fleet.md)."),
                     class_="note"))
    title = "Fleet capture" if kind == "capture" else "Fleet flight recorders"
    return page(title, "".join(parts), subtitle=subtitle, interactive=False)


def _target_cell(r: dict[str, Any], flagged: str | None) -> str:
    text = tag("span", esc(r.get("name") or r["target"]), class_="id")
    if r.get("name"):
        text += tag("div", esc(r["target"]), class_="note")
    return text + (tag("div", "outlier", class_="state state-failed") if r["target"] == flagged else "")


def _capture_link(r: dict[str, Any]) -> str:
    capture = r.get("capture")
    if not capture:
        return "–"
    return tag("a", esc(capture), href=f"{r['target']}/profile/{capture}/report", class_="id")
