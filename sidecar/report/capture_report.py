"""``render_capture_report``: the analyser's summary (docs/analysis.md) as one self-contained HTML page.

Sections, in the order a person asks: the headline and findings in words, where to get the trace,
each process's timeline, the devices' busy time, top kernels and ops, idle gaps by cause, syncs,
collectives and copies, then every step. Everything is built from the summary dict alone (the JSON a
capture saves, or ``analyze_path``'s), so the sidecar and ``sidecar analyze --html`` draw the same page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..common.version import __version__
from ..analysis.summary import unique_short_names
from .charts import Bar, bar_chart, legend, share_bar
from .document import page
from .findings import CAUSE_WORDS, findings
from .markup import count, duration, esc, percent, table, tag
from .phases_view import anatomy_section, entry_for, phase_legend
from .timeline import process_timeline

STEP_ROWS = 1000  # a page lists at most this many steps per process; the JSON has them all


@dataclass(frozen=True)
class Link:
    text: str
    href: str
    filename: str | None = None  # the name a download is saved under


def render_capture_report(summary: dict, *, title: str = "Capture report", subtitle: str | None = None,
                          downloads: Sequence[Link] = (), interactive: bool = False,
                          capture: dict | None = None) -> str:
    """The page. ``downloads``: the trace and other files to offer; ``interactive``: served by the
    sidecar (its script sends the token with downloads), not a file; ``capture``: the capture's JSON
    (``GET /profile/{id}``), whose ``trigger`` or ``alert`` says why it exists."""
    sections = [
        _headline(summary), _started_by(capture), _findings(summary), _downloads(summary, downloads), _timelines(summary),
        anatomy_section(summary), _devices(summary), _kernels(summary), _ops(summary), _gaps(summary), _syncs(summary),
        _collectives(summary), _python_stacks(summary), _sync_scan(summary), _steps(summary),
        tag("p", f"Summary schema {esc(summary.get('schema_version'))}; page by inference-sidecar "
                 f"{esc(__version__)}. Field meanings: docs/analysis.md.", class_="note"),
    ]
    return page(title, "".join(s for s in sections if s),
                subtitle=subtitle if subtitle is not None else summary["source"]["path"], interactive=interactive)


def _section(ident: str, heading: str, content: str) -> str:
    return tag("section", tag("h2", esc(heading)) + content, id=ident)


def _headline(s: dict) -> str:
    files = s["source"]["files"]
    events = sum(f["events"] for f in files)
    body = tag("p", esc(s["headline"]), class_="headline")
    body += tag("p", esc(f"{len(files)} file{'s' if len(files) != 1 else ''}, {events:,} events, "
                         f"{len(s['processes'])} process{'es' if len(s['processes']) != 1 else ''}"), class_="muted")
    body += "".join(tag("div", esc(w), class_="warn") for w in s.get("warnings", []))
    return _section("headline", "Summary", body)


def _started_by(capture: dict | None) -> str:
    """Why the capture exists, where a trigger or an Alertmanager alert started it (none: a client did)."""
    alert = (capture or {}).get("alert")
    trigger = (capture or {}).get("trigger")
    if isinstance(alert, dict):
        labels = alert.get("labels") or {}
        label_text = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
        body = tag("p", "Started by the Alertmanager alert " + tag("strong", esc(alert.get("name") or "(no alertname)"))
                   + esc(f", firing since {alert.get('starts_at')}") + (esc(f" ({label_text})") if label_text else ""))
        body += tag("p", esc(f"fingerprint {alert.get('fingerprint')} · firing {alert.get('firing')}"), class_="muted")
    elif isinstance(trigger, dict):
        body = tag("p", "Started by the trigger " + tag("strong", esc(trigger.get("name") or trigger.get("trigger")))
                   + esc(f": {trigger.get('metric')} observed {trigger.get('observed_ms')} ms "
                         f"over {trigger.get('threshold_ms')} ms"))
        body += tag("p", esc(f"trigger {trigger.get('trigger')} · firing {trigger.get('firing')}"), class_="muted")
    else:
        return ""
    return _section("started-by", "Why this capture", body)


def _findings(s: dict) -> str:
    return _section("findings", "Findings", tag("ul", "".join(tag("li", esc(f)) for f in findings(s)),
                                                class_="findings"))


def _downloads(s: dict, links: Sequence[Link]) -> str:
    items = "".join(tag("li", tag("a", esc(link.text), href=link.href, download=link.filename or True,
                                  data_download=True)) for link in links)
    body = tag("ul", items) if items else ""
    starts = "; ".join(f"{p['label']} at ts {p['start_ts_us']:.0f} µs" for p in s["processes"])
    body += tag("p", "Open the trace in Perfetto: go to " + tag("a", "ui.perfetto.dev", href="https://ui.perfetto.dev",
                                                              rel="noopener noreferrer")
                + ", choose <em>Open trace file</em> and pick the downloaded <code>.json.gz</code> (Perfetto reads "
                  "it in the browser; the file is not uploaded). <code>chrome://tracing</code> and TensorBoard's "
                  "profiler read it too. "
                + esc(f"Windows start ({starts}) in the trace's own clock."), class_="note")
    return _section("downloads", "Trace", body)


def _timelines(s: dict) -> str:
    # The key names only what some lane draws: a CPU-only capture has no GPU lanes, and no idle causes.
    gpu = bool(s["gpu"]["kernel_count"] or s["gaps"]["count"])
    marks = [("c-step", "step"), ("c-cut", "step cut off")]
    marks += [("c-syncmark", "syncs in the step")] if any(st.get("sync_count") for st in s["steps"]) else []
    marks += [(f"c-{c}", f"idle: {c}") for c in CAUSE_WORDS] if gpu else []
    parts = [legend(marks), phase_legend(s)]
    for p in s["processes"]:
        head = tag("h3", esc(p["label"]) + " " + tag("span", esc(f"{duration(p['window_us'])} captured"),
                                                    class_="muted"))
        largest = (p.get("gaps") or {}).get("largest") or []
        notes = [f"Idle gaps drawn: the {len(largest)} longest of {p['gaps']['count']:,}."] if largest else []
        if not p["steps"]:
            notes.append("No ProfilerStep ranges: no steps to draw.")
        note = tag("p", esc(" ".join(notes)), class_="note") if notes else ""
        parts.append(head + process_timeline(p, entry_for(s, p)) + note)
    return _section("timeline", "Timeline", "".join(parts))


def _devices(s: dict) -> str:
    devices = s["gpu"]["devices"]
    if not devices:
        return _section("devices", "GPU busy", tag("p", "No GPU kernels in this trace.", class_="muted"))
    bars = []
    for d in devices:
        owner = f" · {d['process']}" if d.get("process") else ""
        bars.append(Bar(f"device {d['device']}{owner}", d["busy_us"],
                        f"{percent(d['busy_fraction'])} of {duration(d['span_us'])}",
                        f"device {d['device']}{owner}: busy {duration(d['busy_us'])} of {duration(d['span_us'])}, "
                        f"{d['kernel_count']:,} kernels", backdrop=d["span_us"]))
        for st in d["streams"]:
            bars.append(Bar(f"stream {st['stream']}", st["busy_us"],
                            f"{duration(st['busy_us'])}, {st['kernel_count']:,} kernels",
                            f"device {d['device']} stream {st['stream']}: busy {duration(st['busy_us'])}",
                            backdrop=d["span_us"]))
    body = bar_chart(bars, label="GPU busy time per device and stream")
    body += tag("p", "Dark: busy (at least one kernel running); light: the process's window.", class_="note")
    return _section("devices", "GPU busy", body)


def _kernels(s: dict) -> str:
    kernels = s["gpu"]["top_kernels"]
    if not kernels:
        return ""
    names = unique_short_names([k["name"] for k in kernels], 56)
    chart = bar_chart([Bar(names[k["name"]], k["total_us"], f"{duration(k['total_us'])} ({percent(k['fraction'])})",
                           f"{k['name']}: {k['count']:,}×, mean {duration(k['mean_us'])}") for k in kernels],
                      label="top kernels by total time")
    rows = [(tag("span", esc(k["name"])), count(k["count"]), duration(k["total_us"]), percent(k["fraction"]),
             duration(k["mean_us"]), duration(k["max_us"])) for k in kernels]
    detail = tag("details", tag("summary", "Full names and figures")
                 + table(["kernel", "count", "total", "share", "mean", "max"], _name_cells(rows), numeric=range(1, 6)))
    return _section("kernels", "Top kernels", chart + detail)


def _ops(s: dict) -> str:
    ops = s["cpu"]["top_ops"]
    if not ops:
        return ""
    chart = bar_chart([Bar(o["name"], o["self_us"], f"{duration(o['self_us'])} self, {o['count']:,}×",
                           f"{o['name']}: self {duration(o['self_us'])}, total {duration(o['total_us'])}")
                       for o in ops], label="top CPU ops by self time")
    cpu = s["cpu"]
    note = tag("p", esc(f"{cpu['op_count']:,} ops on {cpu['threads']} host threads, "
                        f"{duration(cpu['self_time_us'])} of self time."), class_="note")
    return _section("ops", "Top CPU ops (self time)", chart + note)


def _gaps(s: dict) -> str:
    gaps = s["gaps"]
    if not gaps["count"]:
        return _section("gaps", "GPU idle gaps", tag("p", "No idle gaps (or no GPU kernels).", class_="muted"))
    causes = [(c, v) for c, v in gaps["by_cause"].items() if v["count"]]
    bar = share_bar([(c, v["total_us"], f"{c}: {v['count']:,} gaps, {duration(v['total_us'])}") for c, v in causes],
                    label="idle time by cause")
    key = legend([(f"c-{c}", f"{c}: {duration(v['total_us'])} in {v['count']:,}") for c, v in causes])
    meaning = tag("ul", "".join(tag("li", tag("b", esc(c)) + ": " + esc(CAUSE_WORDS.get(c, c))) for c, _ in causes),
                  class_="note")
    rows = [(duration(g["dur_us"]), duration(g["at_us"]), esc(g["process"]), esc(g["device"]),
             esc("–" if g.get("step") is None else g["step"]), esc(g["cause"]), esc(g.get("detail") or ""))
            for g in gaps["largest"]]
    head = tag("p", esc(f"{gaps['count']:,} gaps of at least {gaps['min_gap_us']:g} µs, "
                        f"{duration(gaps['total_us'])} in all."))
    largest = tag("h3", "Longest gaps") + table(["idle", "at", "process", "device", "step", "cause", "detail"], rows,
                                                numeric=(0, 1))
    return _section("gaps", "GPU idle gaps", head + bar + key + meaning + largest)


def _syncs(s: dict) -> str:
    syncs = s["syncs"]
    if not syncs:
        return _section("syncs", "Synchronisation", tag("p", "None found: the host never waited for the GPU.",
                                                        class_="muted"))
    rows = []
    for x in syncs:
        sites = "".join(tag("div", esc(f"{site['count']:,}× in "
                                       f"{site['python'] or ' > '.join(site['stack'][-3:]) or 'no recorded op'}"))
                        for site in x["sites"][:3])
        rows.append((tag("span", esc(x["name"])), esc(x["kind"]), count(x["count"]), duration(x["total_us"]),
                     duration(x["gpu_idle_after_us"]), count(x["after_dtoh_copy"]), sites))
    body = table(["call", "kind", "count", "host blocked", "GPU idle after", "after DtoH", "where"],
                 _name_cells(rows), numeric=range(2, 6))
    return _section("syncs", "Synchronisation (host blocked on the GPU)", body)


def _collectives(s: dict) -> str:
    c, memcpy = s["collectives"], s["gpu"]["memcpy"]
    parts = []
    if c["count"]:
        parts.append(tag("p", esc(f"{c['count']:,} collective kernels, {duration(c['time_us'])}; "
                                  f"{percent(c['overlap_fraction'])} overlapped with compute, "
                                  f"{duration(c['exposed_us'])} exposed.")))
        rows = [(tag("span", esc(k["name"])), count(k["count"]), duration(k["total_us"]), duration(k["mean_us"]))
                for k in c["top"]]
        parts.append(table(["collective", "count", "total", "mean"], _name_cells(rows), numeric=(1, 2, 3)))
    if memcpy:
        rows = [(esc(d), count(v["count"]), duration(v["total_us"]), count(v["bytes"])) for d, v in memcpy.items()]
        parts.append(tag("h3", "Copies and sets") + table(["kind", "count", "time", "bytes"], rows, numeric=(1, 2, 3)))
    launches = s["launches"]
    if launches["count"]:
        parts.append(tag("p", esc(f"Launches: {launches['count']:,} calls, {duration(launches['total_us'])} of CPU "
                                  f"time (mean {duration(launches['mean_us'])})."), class_="note"))
    return _section("collectives", "Collectives, copies, launches", "".join(parts)) if parts else ""


def _python_stacks(s: dict) -> str:
    stacks = s.get("python_stacks") or {}
    parts = []
    for label, entry in stacks.items():
        rows = [(duration(r["time_ms"] * 1000), percent(r["share"]), tag("span", esc(r["function"])),
                 esc(f"{r['file']}:{r['line']}")) for r in (entry.get("top_self") or [])[:10]]
        head = tag("h3", esc(f"{label} — {entry.get('stacks')}, {entry.get('samples', 0):,} samples"))
        err = tag("div", esc(entry["error"]), class_="warn") if entry.get("error") else ""
        parts.append(head + err + (table(["time", "share", "function", "line"], rows, numeric=(0, 1)) if rows else ""))
    return _section("python-stacks", "Python stacks (sampled)", "".join(parts)) if parts else ""


def _sync_scan(s: dict) -> str:
    scan = s.get("sync_scan")
    if not scan or not scan.get("sites"):
        return ""
    rows = []
    for site in scan["sites"]:
        where = f"{site.get('path') or site.get('file')}:{site['line']}" if site.get("line") else \
            site.get("function") or site.get("cpu_op") or "outside any recorded op"
        rows.append((count(site["count"]), duration(site["blocked_us"]), esc(site["classification"]),
                     esc(site["phase"]), tag("span", esc(site["op"])), esc(where)))
    return _section("sync-sites", "Sync sites", table(["count", "blocked", "class", "phase", "op", "site"],
                                                      rows, numeric=(0, 1)))


def _steps(s: dict) -> str:
    parts = []
    for p in s["processes"]:
        steps = p["steps"]
        if not steps:
            continue
        rows = [(esc(st["step"]) + (" (cut off)" if st.get("partial") else ""), duration(st["wall_us"]),
                 count(st["kernel_count"]), duration(st["kernel_time_us"]), percent(st["gpu_busy_fraction"]),
                 count(st["launch_count"]), count(st["sync_count"]), duration(st["sync_us"]), count(st["gap_count"]),
                 duration(st["gap_us"])) for st in steps[:STEP_ROWS]]
        more = tag("p", esc(f"{len(steps) - STEP_ROWS:,} more steps in the summary JSON."), class_="note") \
            if len(steps) > STEP_ROWS else ""
        parts.append(tag("details", tag("summary", esc(f"{p['label']}: {len(steps):,} step{'s' if len(steps) != 1 else ''}"))
                         + table(["step", "wall", "kernels", "kernel time", "GPU busy", "launches", "syncs",
                                  "blocked", "gaps", "idle"], rows, numeric=range(0, 10)) + more,
                         open=len(s["processes"]) == 1 or None))
    return _section("steps", "Steps", "".join(parts)) if parts else ""


def _name_cells(rows: list[tuple]) -> list[tuple]:
    """Rows whose first cell is a name: set in monospace, long names wrap."""
    return [(tag("span", cells[0], class_="name mono"),) + tuple(cells[1:]) for cells in rows]
