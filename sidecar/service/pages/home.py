"""The sidecar's home page (``GET /``): the flight recorder's last minutes drawn, the requests in
flight, a stuck step and the stacks of every process (``#recorder``, drawn and refreshed by the page
script from ``GET /recorder/timeline``, ``/stacks``); what is connected, what was captured, scanned and
timed per module, the triggers, and forms to start a capture or a scan.

``render_home`` draws it from a plain dict of the service's state, the same JSON the API serves
(``/processes``, ``/profiles``, ``/syncs``, ``/modules``, ``/triggers``; sidecar/service/routes/pages.py builds it), so
the page shows nothing the API does not and needs nothing of aiohttp. The part that changes,
``#live``, is marked ``data-active`` while a job runs: the page script then refreshes it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from ...report.document import page
from .forms import capture_fields, scan_fields, start_form
from ...report.markup import count, duration, esc, table, tag, when

FINAL = ("done", "partial", "failed", "cancelled")
# The job kinds: the state's ``active_<key>``, the name shown, the stop endpoint.
_KINDS = (("capture", "capture", "/profile/stop"), ("scan", "scan", "/sync/stop"),
          ("modules", "module timing", "/modules/stop"), ("memory", "memory snapshot", "/memory/stop"))


def render_home(state: dict[str, Any]) -> str:
    live = _live(state)
    forms = tag("section", tag("h2", "Start a capture") + start_form(
        "capture-form", "/profile/start", capture_fields(state["max_steps"]), "Start capture")
        + tag("h2", "Start a hidden-sync scan") + start_form(
        "scan-form", "/sync/start", scan_fields(state["max_steps"]), "Start scan")
        + tag("p", "The forms call the JSON API (docs/api.md): the same parameters, checked by the same code.",
              class_="note"), id="start")
    lists = (tag("datalist", "".join(tag("option", "", value=r) for r in state["roles"]), id="roles")
             + tag("datalist", "".join(tag("option", "", value=s["id"]) for s in state["scans"]), id="scan-ids")
             + tag("datalist", "".join(tag("option", "", value=i) for i in _instances(state)), id="instances"))
    subtitle = f"version {state['version']} · " + ("token required" if state["token"] else "no token (loopback only)")
    return page("inference-sidecar", _recorder(state) + live + forms + lists, subtitle=subtitle)


# The chart's windows (GET /recorder/timeline?seconds=): 1, 10 and 60 minutes; 10 at first.
WINDOWS = ((60, "1 min"), (600, "10 min"), (3600, "60 min"))
DEFAULT_WINDOW = 600


def _recorder(state: dict[str, Any]) -> str:
    """The last minutes and now, at the top: the page script draws the chart from
    ``GET /recorder/timeline`` and refreshes it every few seconds while the tab is visible; the stuck
    steps the watchdogs report are written here already, so that they show before the first refresh."""
    buttons = "".join(tag("button", esc(text), type="button", data_window=seconds,
                          aria_pressed="true" if seconds == DEFAULT_WINDOW else "false")
                      for seconds, text in WINDOWS)
    toolbar = tag("p", "Window " + buttons + tag("span", "", id="timeline-status", class_="muted"),
                  class_="toolbar")
    stuck = "".join(tag("p", esc(f"{p['label']}: step {p['stuck'].get('step')} stuck for "
                                 f"{p['stuck'].get('age_s')} s (the watchdog reports it)"), class_="stuck")
                    for p in state["processes"] if p.get("stuck"))
    chart = tag("div", tag("p", "The chart is drawn by the page script from GET /recorder/timeline.",
                           class_="muted"), id="chart", data_max_steps=state["max_steps"])
    panel = tag("div", "", id="step-panel", hidden=True)
    now = (tag("h3", "Requests in flight") + tag("div", tag("p", "–", class_="muted"), id="in-flight")
           + tag("h3", "Python stacks")
           + tag("p", tag("button", "Take stacks of every process", type="button", id="take-stacks")
                 + tag("output", "", id="stacks-out"), class_="toolbar")
           + tag("div", "", id="stacks"))
    return tag("section", tag("h2", "The last minutes") + tag("div", stuck, id="stuck") + toolbar + chart + panel
               + now, id="recorder")


def _live(state: dict[str, Any]) -> str:
    active = [(kind, state.get(f"active_{key}")) for key, kind, _ in _KINDS if state.get(f"active_{key}")]
    # A capture is still exporting after its processes ended (no longer the active job): followed too.
    modules, memory = state.get("modules", []), state.get("memory", [])
    unsettled = [job for job in state["captures"] + state["scans"] + modules + memory if job["state"] not in FINAL]
    status = f"{len(state['processes'])} engine process{'es' if len(state['processes']) != 1 else ''} connected"
    status += "".join(f" · {kind} {job} running" for kind, job in active)
    stops = "".join(tag("button", esc(f"Stop {kind}"), type="button", data_post=path, data_out="stop-out")
                    for key, kind, path in _KINDS if state.get(f"active_{key}"))
    head = tag("p", esc(status) + (" " + stops if stops else "") + tag("output", "", id="stop-out"), class_="headline")
    body = (head + _processes(state["processes"]) + _captures(state["captures"]) + _scans(state["scans"])
            + _modules(modules) + _memory(memory) + _triggers(state["triggers"]))
    return tag("section", body, id="live", data_active=bool(active or unsettled) or None)


def _processes(processes: list[dict]) -> str:
    if not processes:
        return _part("processes", "Engine processes", tag(
            "p", "None connected. Is the plugin installed in the engine, and SIDECAR_ENDPOINT pointing here?",
            class_="muted"))
    rows = []
    for p in processes:
        stuck = p.get("stuck")
        rows.append((esc(p["label"]), esc(p["role"]), esc("–" if p["rank"] is None else p["rank"]),
                     esc(p.get("engine") or "–"), esc(p.get("host") or "–"), "yes" if p.get("cuda") else "no",
                     count(p.get("last_step")), esc("–" if p.get("step_rate") is None else p["step_rate"]),
                     duration(p["open_step_ms"] * 1000) if p.get("open_step_ms") is not None else "–",
                     esc(f"stuck in step {stuck.get('step')} for {stuck.get('age_s')} s") if stuck else ""))
    return _part("processes", "Engine processes", table(
        ["process", "role", "rank", "engine", "host", "CUDA", "steps", "steps/s", "running step", "watchdog"],
        rows, numeric=(6, 7, 8)))


def _captures(captures: list[dict]) -> str:
    if not captures:
        return _part("captures", "Captures", tag("p", "No captures yet.", class_="muted"))
    rows = []
    for c in captures:
        ident = quote(c["id"], safe="")
        links = []
        if c["state"] in FINAL and c.get("summary"):
            links.append(tag("a", "report", href=f"/profile/{ident}/report"))
        if c.get("trace"):
            links.append(_download("trace", c["trace"], f"{c['id']}-trace.json.gz"))
        if c.get("summary"):
            links.append(_download("summary", c["summary"], f"{c['id']}-summary.json"))
        links.append(_download("JSON", f"/profile/{ident}", f"{c['id']}.json"))
        by = "trigger " + str(c["trigger"].get("name") or c["trigger"].get("trigger")) if c.get("trigger") else \
            "alert " + str(c["alert"].get("name") or c["alert"].get("fingerprint")) if c.get("alert") else \
            "request " + str(c["request"].get("id")) if c.get("request") else "user"
        what = c.get("headline") or c.get("reason") or ""
        rows.append((tag("span", esc(c["id"]), class_="id"), _state(c["state"]), when(c.get("created_at")),
                     esc(c.get("steps")), esc(by), esc(what), " · ".join(links)))
    return _part("captures", "Captures", table(["id", "state", "started", "steps", "asked by", "headline", ""], rows,
                                              numeric=(3,)))


def _scans(scans: list[dict]) -> str:
    if not scans:
        return _part("scans", "Hidden-sync scans", tag("p", "No scans yet.", class_="muted"))
    rows = [(tag("span", esc(s["id"]), class_="id"), _state(s["state"]), when(s.get("created_at")),
             esc(s.get("steps")), count(s.get("hidden")), count(s.get("expected")), esc(s.get("reason") or ""),
             _download("JSON", f"/sync/{quote(s['id'], safe='')}", f"{s['id']}.json")) for s in scans]
    return _part("scans", "Hidden-sync scans", table(
        ["id", "state", "started", "steps", "hidden", "expected", "reason", ""], rows, numeric=(3, 4, 5)))


def _modules(jobs: list[dict]) -> str:
    """Module-timing jobs (``GET /modules``): the job's headline where its JSON has one, else the module
    with the most self time, else its reason."""
    if not jobs:
        return _part("modules", "Module timing", tag("p", "No module timings yet. Start one with "
                                                          "GET /modules/start (docs/api.md, Module timing).",
                                                     class_="muted"))
    rows = [(tag("span", esc(j["id"]), class_="id"), _state(j["state"]), when(j.get("created_at")),
             esc(j.get("steps")), esc(_module_headline(j)),
             _download("JSON", f"/modules/{quote(j['id'], safe='')}", f"{j['id']}.json")) for j in jobs]
    return _part("modules", "Module timing", table(["id", "state", "started", "steps", "slowest module", ""], rows,
                                                   numeric=(3,)))


def _module_headline(job: dict) -> str:
    if job.get("headline"):
        return str(job["headline"])
    timed = [m for m in job.get("modules") or [] if m.get("self_ms") is not None]
    if timed:
        top = max(timed, key=lambda m: m["self_ms"])
        share = f", {top['self_share'] * 100:.1f}% of the forward" if top.get("self_share") is not None else ""
        return f"{top.get('path') or 'the model'} ({top.get('type')}): {top['self_ms']:.3f} ms self{share}"
    return str(job.get("reason") or "")


def _memory(jobs: list[dict]) -> str:
    """Memory snapshots (``GET /memory``): the highest peak and whose, the job's page, its JSON."""
    if not jobs:
        return _part("memory", "Memory snapshots", tag("p", "None yet. Take one on a CUDA host with "
                                                             "GET /memory/start (docs/api.md, Memory snapshot).",
                                                       class_="muted"))
    rows = []
    for j in jobs:
        peak = j.get("peak") or {}
        told = (f"{peak['allocated_bytes'] / 2**20:,.1f} MiB allocated in {peak.get('process')}"
                if isinstance(peak.get("allocated_bytes"), int) else str(j.get("reason") or ""))
        job_url = f"/memory/{quote(j['id'], safe='')}"
        rows.append((tag("span", esc(j["id"]), class_="id"), _state(j["state"]), when(j.get("created_at")),
                     esc(j.get("steps")), esc(told),
                     tag("a", "page", href=f"{job_url}/page") + " " + _download("JSON", job_url, f"{j['id']}.json")))
    return _part("memory", "Memory snapshots", table(["id", "state", "started", "steps", "peak", ""], rows,
                                                     numeric=(3,)))


def _triggers(triggers: list[dict]) -> str:
    if not triggers:
        return _part("triggers", "Triggers", tag("p", "None. Add one with POST /triggers or sidecar serve --triggers "
                                                      "(docs/api.md, Triggers).", class_="muted"))
    rows = []
    for t in triggers:
        r = t["rule"]
        percentile = f" p{r['percentile']:g}" if r.get("percentile") else ""
        rule = f"{r['metric']}{percentile} > {r['threshold_ms']:g} ms"
        counts = t.get("counts") or {}
        rows.append((esc(r.get("name") or t["id"]), esc(rule), count(counts.get("fired", 0)),
                     count(counts.get("skipped", 0)), count(t.get("fired_last_hour", 0))))
    return _part("triggers", "Triggers", table(["trigger", "rule", "fired", "skipped", "last hour"], rows,
                                              numeric=(2, 3, 4)))


def _instances(state: dict[str, Any]) -> list[str]:
    """The engine instances the connected processes name (``instance`` in /processes, where given)."""
    return sorted({str(p["instance"]) for p in state["processes"] if p.get("instance")})


def _part(ident: str, heading: str, content: str) -> str:
    return tag("div", tag("h2", esc(heading)) + content, id=ident)


def _state(state: str) -> str:
    return tag("span", esc(state), class_=f"state state-{state}")


def _download(text: str, href: str, filename: str) -> str:
    """A link the page script fetches with the token when the sidecar has one (a plain link cannot send it)."""
    return tag("a", esc(text), href=href, download=filename, data_download=True)
