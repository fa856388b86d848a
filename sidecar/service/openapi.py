"""The OpenAPI 3.1 document of the HTTP API, served at ``GET /openapi.json`` (docs/api.md, "OpenAPI").

It is built from the app's own route table: every route must have an entry in ``OPERATIONS`` (a route
without one fails the build, and tests/service/test_openapi.py checks both directions and the headings
of docs/api.md). The start parameters come from jobs/params.py: their names are ``KNOWN`` and
``SCAN_KNOWN`` (the build fails when a name has no schema here, or a schema no name), their enums
``ACTIVITIES``, ``STACK_MODES`` and the standard roles, their ranges the same constants the parser
checks against, so the document cannot drift from what the parser accepts.
"""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import hdrs, web

from ..common.version import __version__
from ..common import auth, config
from ..common.protocol import DEFAULT_STACK_HZ, MAX_STACK_HZ, METRICS_PUSH_PATH, PROBE_WS_PATH
from .routes.diff import DIFF_FORMATS
from .jobs.model import CAPTURE, MODULES, SCAN
from .routes.keys import SETTINGS
from .routes.metrics import DECODED_ENCODINGS, MAX_BODY_BYTES, PROTOBUF, SCRAPE_PATH
from .jobs.params import (ACTIVITIES, BACKENDS, BOOLEAN_OPTIONS, DEFAULT_RECORDER_SECONDS, DEFAULT_STACKS_HZ, KNOWN, MAX_INSTANCE, MAX_STACKS_HZ,
                     MIN_STACK_HZ, RECORDER_FORMATS, SCAN_KNOWN, STACK_MODES, STACKS_FORMATS, STACKS_MODES,
                     STACKS_THREADS, known_roles)
from .jobs.params import MAX_MODULE_STEPS, MODULES_KNOWN
from .jobs.params import MAX_MEMORY_STEPS, MEMORY_KNOWN
from .jobs.model import MEMORY
from ..common.protocol import DEFAULT_MEMORY_ENTRIES, MAX_MEMORY_ENTRIES
from .store.layout import FLEET_ID
from ..common.protocol import MAX_QUERY_SECONDS, MAX_SAMPLE_SECONDS
from .incidents import trigger_rules as tr
from .incidents import recorder_timeline as tl
from .routes.timeline import MAX_SECONDS as TIMELINE_MAX_S, MAX_SLOW_MS as TIMELINE_MAX_SLOW_MS
from .routes.timeline import MIN_SECONDS as TIMELINE_MIN_S, TIMELINE_PATH
from .incidents import alert_payload as ap
from .incidents.alert_actions import MAX_LABEL_VALUE
from .routes.alerts import MAX_BODY_BYTES as ALERTS_MAX_BODY_BYTES
from .routes.request_body import JSON

__all__ = ["OPENAPI_PATH", "OPERATIONS", "build_document", "id_pattern", "openapi_json"]

OPENAPI_PATH = "/openapi.json"
# A route registered for every method ("*": the start routes) serves these; start_params refuses the rest.
ANY_METHOD = ("GET", "POST")


def id_pattern(kind) -> str:
    """The ids ``kind.is_id`` accepts (jobs/model.py: ``YYYYmmdd-HHMMSS-xxxxxx`` after the kind's prefix)."""
    return "^" + kind.id_prefix + r"[0-9]{8}-[0-9]{6}-[0-9a-f]{6}$"


def _process_pattern() -> str:
    return "^(" + "|".join(known_roles()) + r")(:[0-9]+)?$"


def _start_parameters(max_steps: int) -> dict[str, dict[str, Any]]:
    """Every start parameter of either kind: name -> (schema, description, list-valued)."""
    boolean = {"type": "boolean"}
    params: dict[str, dict[str, Any]] = {
        "steps": {"schema": {"type": "integer", "minimum": 1, "maximum": max_steps},
                  "required": True, "description": "working steps to record or scan, 1..--max-steps"},
        "delay": {"schema": {"type": "integer", "minimum": 0, "maximum": max_steps, "default": 0},
                  "description": "working steps to skip first"},
        "activities": {"schema": {"type": "array", "items": {"type": "string", "enum": list(ACTIVITIES)},
                                  "minItems": 1},
                       "list": True, "description": "comma-separated; default: what each host has"},
        "processes": {"schema": {"type": "array", "items": {"type": "string", "pattern": _process_pattern()},
                                 "minItems": 1},
                      "list": True, "description": "roles to include, optionally role:rank (comma-separated); "
                                                   "default: all"},
        "instance": {"schema": {"type": "string", "minLength": 1, "maxLength": MAX_INSTANCE},
                     "description": "only the processes of this engine instance (as /processes lists it; "
                                    "its data-parallel engine cores too); default: all"},
        "timeout_s": {"schema": {"type": "number", "exclusiveMinimum": 0, "maximum": config.MAX_CAPTURE_TIMEOUT_S,
                                 "default": config.DEFAULT_CAPTURE_TIMEOUT_S},
                      "description": "give up waiting for steps after this many seconds"},
        "stacks": {"schema": {"type": "string", "enum": list(STACK_MODES), "default": "none"},
                   "description": "Python stacks (docs/api.md, Python stacks)"},
        "with_stack": {"schema": boolean, "description": "the older spelling: true is stacks=sampled"},
        "stack_hz": {"schema": {"type": "number", "minimum": MIN_STACK_HZ, "maximum": MAX_STACK_HZ,
                                "default": DEFAULT_STACK_HZ},
                     "description": "sampling rate of sampled stacks (only with stacks)"},
        "backend": {"schema": {"type": "string", "enum": list(BACKENDS), "default": "torch"},
                    "description": "torch: a torch.profiler trace; nsys: cudaProfilerStart/Stop and NVTX ranges "
                                   "for an engine run under nsys launch --capture-range=cudaProfilerApi "
                                   "(docs/gpu.md); the torch.profiler options are a 400 beside it"},
        "fleet": {"schema": {"type": "string", "pattern": f"^{FLEET_ID.pattern}$"},
                  "description": "the fleet capture this one belongs to: stored under fleets/<fleet>/ (docs/fleet.md)"},
        "baseline": {"schema": {"type": "string", "pattern": id_pattern(SCAN)},
                     "description": "id of an earlier scan: new_sites lists only sites it did not have"},
        **{name: {"schema": boolean, "description": "torch.profiler option"} for name in BOOLEAN_OPTIONS},
        "max_entries": {"schema": {"type": "integer", "minimum": 1, "maximum": MAX_MEMORY_ENTRIES,
                                   "default": DEFAULT_MEMORY_ENTRIES},
                        "description": "a memory snapshot's history: at most this many alloc/free events "
                                       "(torch's max_entries)"},
    }
    parsed = KNOWN | SCAN_KNOWN | MEMORY_KNOWN
    if set(params) != parsed:
        raise RuntimeError(f"start parameters documented {sorted(params)} != parsed {sorted(parsed)}")
    return params


def _query_parameters(names: set[str], max_steps: int) -> list[dict[str, Any]]:
    table = _start_parameters(max_steps)
    out = []
    for name in sorted(names, key=lambda n: (n != "steps", n)):
        p = table[name]
        param = {"name": name, "in": "query", "required": p.get("required", False),
                 "description": p["description"], "schema": p["schema"]}
        if p.get("list"):
            param.update(style="form", explode=False)
        out.append(param)
    return out


def _body(names: set[str], max_steps: int) -> dict[str, Any]:
    """A start's body: the same parameters as a JSON object (lists: comma-separated). Forms are refused
    (browser_guard.py): a page on another site can make a browser send one."""
    table = _start_parameters(max_steps)
    props = {}
    for name in sorted(names):
        schema = copy.deepcopy(table[name]["schema"])
        if schema["type"] == "array":
            schema = {"type": "string", "description": "comma-separated"}
        props[name] = schema
    schema = {"type": "object", "properties": props, "required": ["steps"], "additionalProperties": False}
    return {"required": False, "description": "overrides the query string's parameters (docs/api.md, Request bodies)",
            "content": {JSON: {"schema": schema}}}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _ok(description: str, required: list[str] | None = None, content_type: str = JSON) -> dict[str, Any]:
    if content_type != JSON:
        return {"description": description, "content": {content_type: {"schema": {"type": "string"}}}}
    schema: dict[str, Any] = {"type": "object"}
    if required:
        schema["required"] = required
    return {"description": description, "content": {JSON: {"schema": schema}}}


_STARTED = ["id", "state", "url", "processes"]
_STOPPED = ["id", "state", "url"]
_BUSY = ("another job runs (capture_in_progress, scan_in_progress, module_timing_in_progress or "
         "memory_snapshot_in_progress, with active)")


def _start(kind: str, names: set[str]) -> dict[str, Any]:
    return {"summary": f"start a {kind}", "params": names, "responses": {
        "202": _ok(f"the {kind} started", _STARTED), "400": _error("bad_parameter naming the parameter (param)"),
        "409": _error(_BUSY), "415": _error("unsupported_media_type: a body of another type"),
        "503": _error("no_engine_processes"), "507": _error("insufficient_storage")}}


def _path_param(name: str, pattern: str | None = None) -> dict[str, Any]:
    schema = {"type": "string", **({"pattern": pattern} if pattern else {})}
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


def _processes_query() -> dict[str, Any]:
    return {**_query("processes", {"type": "array", "items": {"type": "string", "pattern": _process_pattern()},
                                   "minItems": 1}, "roles to ask, optionally role:rank (comma-separated); default: all"),
            "style": "form", "explode": False}


_INCIDENT_ERRORS = {"400": _error("bad_parameter naming the parameter (param)"), "503": _error("no_engine_processes")}
# /stacks and /recorder: one at a time per engine process (channel/query_slots.py).
_ONE_AT_A_TIME = {"429": _error("query_in_progress: a selected process runs a stacks or recorder query (Retry-After)")}

TRIGGER_ID_PATTERN = "^trg-[0-9a-f]{8}$"
_TRIGGER_RULE = {
    "type": "object", "required": ["metric", "threshold_ms"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": tr.MAX_NAME},
        "metric": {"type": "string", "enum": list(tr.METRICS)},
        "threshold_ms": {"type": "number", "exclusiveMinimum": 0, "maximum": tr.MAX_THRESHOLD_MS},
        "percentile": {"type": "number", "minimum": tr.MIN_PERCENTILE, "maximum": tr.MAX_PERCENTILE,
                       "description": "absent: a single event (step_duration only)"},
        "window_s": {"type": "number", "minimum": tr.MIN_WINDOW_S, "maximum": tr.MAX_WINDOW_S,
                     "default": tr.DEFAULT_WINDOW_S},
        "min_count": {"type": "integer", "minimum": 1, "maximum": tr.MAX_MIN_COUNT, "default": tr.DEFAULT_MIN_COUNT},
        "action": {"type": "object", "additionalProperties": False, "properties": {
            "capture_steps": {"type": "integer", "minimum": 0, "default": tr.DEFAULT_CAPTURE_STEPS},
            "recorder_seconds": {"type": "number", "minimum": 0, "maximum": MAX_QUERY_SECONDS,
                                 "default": tr.DEFAULT_RECORDER_SECONDS},
            "sync_scan": {"type": "boolean", "default": False}}},
        "cooldown_s": {"type": "number", "minimum": 1, "maximum": tr.MAX_COOLDOWN_S, "default": tr.DEFAULT_COOLDOWN_S},
        "budget_per_hour": {"type": "integer", "minimum": 1, "maximum": tr.MAX_BUDGET, "default": tr.DEFAULT_BUDGET},
    },
}

_ALERTMANAGER_PAYLOAD = {
    "type": "object", "required": ["version", "alerts"], "properties": {
        "version": {"const": ap.VERSION},
        "alerts": {"type": "array", "maxItems": ap.MAX_ALERTS, "items": {
            "type": "object", "required": ["status", "labels", "startsAt"], "properties": {
                "status": {"type": "string", "enum": list(ap.STATUSES)},
                "labels": {"type": "object", "maxProperties": ap.MAX_LABELS,
                           "additionalProperties": {"type": "string", "maxLength": MAX_LABEL_VALUE}},
                "startsAt": {"type": "string", "format": "date-time"},
                "fingerprint": {"type": "string", "pattern": f"^[0-9A-Za-z]{{1,{ap.MAX_FINGERPRINT}}}$"}}}}},
}

# (method, path) -> the operation: summary, responses, and where it differs from the rest: "params" (the
# start parameters it takes), "path" (path parameters), "security" (none: the routes with their own).
OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    **{(m, "/profile/start"): _start("capture", KNOWN) for m in ANY_METHOD},
    ("POST", "/profile/stop"): {"summary": "stop the running capture early", "responses": {
        "200": _ok("the capture, stopped", _STOPPED), "409": _error("no_active_capture")}},
    ("GET", "/profile/{id}"): {"summary": "a capture", "path": [_path_param("id", id_pattern(CAPTURE))],
                               "responses": {"200": _ok("the capture", ["id", "state"]),
                                             "404": _error("no such capture")}},
    ("GET", "/profile/{id}/trace"): {"summary": "the merged trace (gzip JSON)",
                                     "path": [_path_param("id", id_pattern(CAPTURE))], "responses": {
        "200": _ok("the merged trace", content_type="application/gzip"), "404": _error("no such capture or trace"),
        "409": _error("the capture still runs"), "410": _error("the file was removed")}},
    ("GET", "/profile/{id}/files/{name}"): {"summary": "one process's trace file (gzip JSON)",
                                            "path": [_path_param("id", id_pattern(CAPTURE)), _path_param("name")],
                                            "responses": {
        "200": _ok("the file", content_type="application/gzip"), "404": _error("no such capture or file"),
        "409": _error("the capture still runs"), "410": _error("the file was removed")}},
    ("GET", "/profile/{id}/summary"): {"summary": "the analysis of the merged trace (docs/analysis.md)",
                                       "path": [_path_param("id", id_pattern(CAPTURE))], "responses": {
        "200": _ok("the summary"), "404": _error("no such capture or summary"), "409": _error("still running")}},
    ("GET", "/profile/{a}/diff/{b}"): {
        "summary": "what changed from capture a to capture b, from their summaries (docs/analysis.md, sidecar diff)",
        "path": [_path_param("a", id_pattern(CAPTURE)), _path_param("b", id_pattern(CAPTURE))],
        "query": [_query("format", {"type": "string", "enum": list(DIFF_FORMATS), "default": "json"},
                         "the diff's JSON, or the text `sidecar diff` prints")],
        "responses": {"200": _ok("the diff", ["schema_version", "a", "b", "basis", "noise", "overall", "kernels",
                                              "ops", "syncs", "gaps", "warnings"]),
                      "400": _error("bad_parameter naming the parameter (param)"),
                      "404": _error("no such capture (the message names it)"),
                      "409": _error("a capture still runs, or ended without a summary"),
                      "410": _error("a summary was removed")}},
    ("GET", "/profile/{id}/report"): {
        "summary": "a finished capture's report: one HTML page for a person (docs/report.md)",
        "description": "A browser (Accept: text/html) gets its errors, and the token prompt where the sidecar "
                       "has a token, as HTML pages; any other client the JSON errors.",
        "path": [_path_param("id", id_pattern(CAPTURE))], "responses": {
        "200": _ok("the report", content_type="text/html"), "404": _error("no such capture, or it has no summary"),
        "409": _error("the capture still runs"), "410": _error("the summary was removed")}},
    ("GET", "/"): {"summary": "the home page: processes, captures, scans, triggers, start forms (docs/report.md)",
                   "description": "HTML for a person; its forms call /profile/start and /sync/start.",
                   "responses": {"200": _ok("the page", content_type="text/html")}},
    ("GET", "/profiles"): {"summary": "recent captures, newest first", "responses": {
        "200": _ok("the captures", ["captures"])}},
    **{(m, "/sync/start"): _start("hidden-sync scan", SCAN_KNOWN) for m in ANY_METHOD},
    ("POST", "/sync/stop"): {"summary": "stop the running scan early", "responses": {
        "200": _ok("the scan, stopped", _STOPPED), "409": _error("no_active_scan")}},
    ("GET", "/sync/{id}"): {"summary": "a scan", "path": [_path_param("id", id_pattern(SCAN))],
                            "responses": {"200": _ok("the scan", ["id", "state"]), "404": _error("no such scan")}},
    ("GET", "/syncs"): {"summary": "recent scans, newest first", "responses": {"200": _ok("the scans", ["scans"])}},
    **{(m, "/modules/start"): {**_start("module timing", MODULES_KNOWN), "max_steps": MAX_MODULE_STEPS}
       for m in ANY_METHOD},
    ("POST", "/modules/stop"): {"summary": "stop the running module timing early", "responses": {
        "200": _ok("the module timing, stopped", _STOPPED), "409": _error("no_active_module_timing")}},
    ("GET", "/modules/{id}"): {"summary": "a module timing: time per module and module type",
                               "path": [_path_param("id", id_pattern(MODULES))],
                               "responses": {"200": _ok("the module timing", ["id", "state"]),
                                             "404": _error("no such module timing")}},
    ("GET", "/modules"): {"summary": "recent module timings, newest first",
                          "responses": {"200": _ok("the module timings", ["jobs"])}},
    **{(m, "/memory/start"): {**_start("memory snapshot", MEMORY_KNOWN), "max_steps": MAX_MEMORY_STEPS,
                              "description": "A 400 no_cuda when no selected process has CUDA."}
       for m in ANY_METHOD},
    ("POST", "/memory/stop"): {"summary": "stop the running memory snapshot early", "responses": {
        "200": _ok("the memory snapshot, stopped", _STOPPED), "409": _error("no_active_memory_snapshot")}},
    ("GET", "/memory/{id}"): {"summary": "a memory snapshot: each process's summary of the CUDA allocator's history",
                              "path": [_path_param("id", id_pattern(MEMORY))],
                              "responses": {"200": _ok("the memory snapshot", ["id", "state"]),
                                            "404": _error("no such memory snapshot")}},
    ("GET", "/memory/{id}/files/{name}"): {
        "summary": "one process's raw snapshot: a pickle for PyTorch's memory viewer (docs/gpu.md)",
        "path": [_path_param("id", id_pattern(MEMORY)), _path_param("name")], "responses": {
            "200": _ok("the raw snapshot", content_type="application/octet-stream"),
            "404": _error("no such memory snapshot or file"), "409": _error("the memory snapshot still runs"),
            "410": _error("the file was removed")}},
    ("GET", "/memory/{id}/page"): {"summary": "a memory snapshot's summary as an HTML page",
                                   "path": [_path_param("id", id_pattern(MEMORY))],
                                   "responses": {"200": _ok("the page", content_type="text/html"),
                                                 "404": _error("no such memory snapshot")}},
    ("GET", "/memory"): {"summary": "recent memory snapshots, newest first",
                         "responses": {"200": _ok("the memory snapshots", ["jobs"])}},
    ("GET", "/syncs/watch"): {"summary": "the always-on sync watch of every connected process", "responses": {
        "200": _ok("processes and sites", ["processes", "sites"])}},
    ("GET", "/recorder"): {
        "summary": "the flight recorder: recent steps, GC pauses and requests of every process, one clock",
        "query": [_query("seconds", {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_QUERY_SECONDS,
                                     "default": DEFAULT_RECORDER_SECONDS}, "how far back"),
                  _query("format", {"type": "string", "enum": list(RECORDER_FORMATS), "default": "json"},
                         "json rows, or a Chrome/Perfetto trace"), _processes_query()],
        "responses": {"200": _ok("the recording (docs/api.md, Flight recorder)"), **_INCIDENT_ERRORS,
                      **_ONE_AT_A_TIME}},
    ("GET", TIMELINE_PATH): {
        "summary": "the flight recorder's last minutes made small for the home page's chart: step-time buckets, "
                   "slow steps with their rows, GC pauses, requests, in flight, stuck steps, captures and firings",
        "query": [_query("seconds", {"type": "number", "minimum": TIMELINE_MIN_S, "maximum": TIMELINE_MAX_S,
                                     "default": tl.DEFAULT_SECONDS}, "the window (the page: 60, 600 or 3600)"),
                  _query("points", {"type": "integer", "minimum": tl.MIN_POINTS, "maximum": tl.MAX_POINTS,
                                    "default": tl.DEFAULT_POINTS}, "buckets the window is cut into"),
                  _query("slow_ms", {"type": "number", "exclusiveMinimum": 0, "maximum": TIMELINE_MAX_SLOW_MS},
                         "a step is slow from here (default: 4 x the median working step)"),
                  _query("gc_ms", {"type": "number", "minimum": 0, "maximum": TIMELINE_MAX_SLOW_MS,
                                   "default": tl.DEFAULT_GC_MS}, "GC pauses marked from here")],
        "responses": {"200": _ok("the timeline (docs/api.md, GET /recorder/timeline)",
                                 ["since_ns", "until_ns", "bucket_ns", "processes", "requests", "in_flight", "stuck",
                                  "marks"]),
                      "400": _error("bad_parameter naming the parameter (param)")}},
    ("GET", "/stacks"): {
        "summary": "every thread's Python stack in every engine process, or a short sampling of them",
        "query": [_query("seconds", {"type": "number", "minimum": 0, "maximum": MAX_SAMPLE_SECONDS, "default": 0},
                         "0: one snapshot; more: sample this long"),
                  _query("hz", {"type": "number", "minimum": 1, "maximum": MAX_STACKS_HZ,
                                "default": DEFAULT_STACKS_HZ}, "sampling rate (with seconds)"),
                  _query("format", {"type": "string", "enum": list(STACKS_FORMATS), "default": "json"},
                         "speedscope needs seconds"),
                  _query("mode", {"type": "string", "enum": list(STACKS_MODES), "default": "python"},
                         "native: through py-spy, where installed and allowed"),
                  _query("threads", {"type": "string", "enum": list(STACKS_THREADS), "default": "all"},
                         "sample every thread or the step thread alone"), _processes_query()],
        "responses": {"200": _ok("the stacks (docs/api.md, Stacks)"), **_INCIDENT_ERRORS, **_ONE_AT_A_TIME,
                      "501": _error("native_stacks_unavailable: py-spy missing or not allowed")}},
    ("GET", "/requests"): {
        "summary": "every request in flight across the engine: age, phase, tokens so far",
        "responses": {"200": _ok("the requests", ["count", "oldest_age_s", "by_phase", "requests", "processes"]),
                      **_INCIDENT_ERRORS}},
    ("POST", "/triggers"): {
        "summary": "add a trigger: a rule on TTFT, TPOT, request duration, queue time or step duration that "
                   "captures the engine when breached (docs/api.md, Triggers)",
        "body": {"required": True, "content": {"application/json": {"schema": _TRIGGER_RULE}}},
        "responses": {"201": _ok("the trigger, with its id", ["id", "rule", "counts", "firings"]),
                      "400": _error("bad_parameter naming the field (param), e.g. action.capture_steps"),
                      "415": _error("unsupported_media_type: send JSON")}},
    ("GET", "/triggers"): {"summary": "the triggers", "responses": {"200": _ok("the triggers", ["triggers"])}},
    ("GET", "/triggers/{id}"): {"summary": "a trigger, with its last firings (newest first)",
                                "path": [_path_param("id", TRIGGER_ID_PATTERN)],
                                "responses": {"200": _ok("the trigger", ["id", "rule", "counts", "firings"]),
                                              "404": _error("no such trigger")}},
    ("DELETE", "/triggers/{id}"): {"summary": "remove a trigger", "path": [_path_param("id", TRIGGER_ID_PATTERN)],
                                   "responses": {"200": _ok("deleted", ["deleted"]),
                                                 "404": _error("no such trigger")}},
    ("POST", "/alerts"): {
        "summary": "Alertmanager's webhook (payload version 4): each firing alert an action of --alert-actions "
                   "matches captures the engine, within its cooldown and budget (docs/api.md, Alerts)",
        "body": {"required": True, "content": {"application/json": {"schema": _ALERTMANAGER_PAYLOAD}}},
        "responses": {"200": _ok("what became of each alert", ["received", "fired", "skipped", "alerts"]),
                      "400": _error("bad_parameter naming the field (param), e.g. alerts[3].labels.instance"),
                      "413": _error(f"too_large: more than {ALERTS_MAX_BODY_BYTES} bytes"),
                      "415": _error("unsupported_media_type: send JSON")}},
    ("GET", "/alerts"): {"summary": "the alert actions, and the last alerts fired and skipped (newest first)",
                         "responses": {"200": _ok("the alerts", ["actions", "own", "counts", "firings", "skipped"])}},
    ("GET", "/processes"): {"summary": "the connected engine processes", "responses": {
        "200": _ok("the processes", ["processes"])}},
    ("GET", "/healthz"): {"summary": "health (no token needed)", "security": [], "responses": {
        "200": _ok("healthy", ["status", "version", "processes", "active_capture", "stuck"])}},
    ("GET", SCRAPE_PATH): {"summary": "Prometheus metrics", "responses": {
        "200": _ok("Prometheus text format", content_type="text/plain")}},
    ("POST", METRICS_PUSH_PATH): {
        "summary": "an OTLP/HTTP metrics push, signed (docs/api.md, Signed metric pushes)", "security": [],
        "headers": [
            {"name": auth.TIMESTAMP_HEADER, "in": "header", "required": True, "schema": {"type": "string",
             "pattern": "^[0-9]+$"}, "description": f"unix seconds, within {auth.PUSH_MAX_SKEW_S} s"},
            {"name": auth.SIGNATURE_HEADER, "in": "header", "required": True, "schema": {"type": "string",
             "pattern": "^[0-9a-f]{64}$"}, "description": "HMAC-SHA256 of the push (docs/api.md)"},
            {"name": "Content-Encoding", "in": "header", "required": False, "schema": {"type": "string",
             "enum": [e for e in DECODED_ENCODINGS if e]}},
        ],
        "body": {"required": True, "content": {PROTOBUF: {"schema": {
            "type": "string", "contentMediaType": PROTOBUF, "maxLength": MAX_BODY_BYTES,
            "description": "an OTLP ExportMetricsServiceRequest"}}}},
        "responses": {"200": _ok("taken (ExportMetricsServiceResponse)", content_type=PROTOBUF),
                      "400": _error("bad_request: not valid gzip, or not an OTLP metrics request"),
                      "401": _error("unauthorized: no valid signature, or a replay"),
                      "413": _error("too_large"), "415": _error("unsupported_media_type")}},
    ("GET", PROBE_WS_PATH): {
        "summary": "the probe channel: a websocket (typed JSON frames, sidecar/common/protocol.py)", "security": [],
        "websocket": True, "description": "Not a REST endpoint: an HTTP upgrade to a websocket, authenticated "
        "in its first frames (docs/api.md, Probe authentication).",
        "responses": {"101": {"description": "switching protocols: the websocket"}}},
    ("GET", OPENAPI_PATH): {"summary": "this document", "responses": {"200": _ok("the OpenAPI document",
                                                                                ["openapi", "paths"])}},
}

_COMMON = {"401": _error("unauthorized: a token is set and the request has no valid bearer token"),
           "403": _error("cross_site_request: a browser sent it for a page of another site, or a form body"),
           "421": _error("host_not_allowed: a Host that is no loopback name, IP address or --allowed-host"),
           "405": _error("method_not_allowed (the Allow header lists the right ones)"),
           "500": _error("internal_server_error: a fault of the sidecar's")}


def route_operations(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route of ``app``, HEAD duplicates of GET left out, "*" as ``ANY_METHOD``."""
    ops = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else None
        if path is None or route.method == hdrs.METH_HEAD:
            continue
        methods = ANY_METHOD if route.method == hdrs.METH_ANY else (route.method,)
        ops.update((m, path) for m in methods)
    return ops


def build_document(app: web.Application) -> dict[str, Any]:
    max_steps = app[SETTINGS].max_steps
    paths: dict[str, dict[str, Any]] = {}
    for method, path in sorted(route_operations(app)):
        if (method, path) not in OPERATIONS:
            raise RuntimeError(f"{method} {path} is a route but has no entry in sidecar/service/openapi.py")
        spec = OPERATIONS[(method, path)]
        op: dict[str, Any] = {"operationId": _operation_id(method, path), "summary": spec["summary"]}
        if "description" in spec:
            op["description"] = spec["description"]
        parameters = list(spec.get("path", [])) + list(spec.get("headers", [])) + list(spec.get("query", []))
        if "params" in spec:
            steps_max = min(max_steps, spec.get("max_steps", max_steps))  # a kind's own cap (module timing)
            parameters += _query_parameters(spec["params"], steps_max)
            if method == "POST":
                op["requestBody"] = _body(spec["params"], steps_max)
        if "body" in spec:
            op["requestBody"] = spec["body"]
        if parameters:
            op["parameters"] = parameters
        responses = dict(spec["responses"])
        if not spec.get("websocket"):
            for status, response in _COMMON.items():
                if status == "401" and spec.get("security") == [] and "401" not in responses:
                    continue
                responses.setdefault(status, response)
        op["responses"] = responses
        if "security" in spec:
            op["security"] = spec["security"]
        if spec.get("websocket"):
            op["x-websocket"] = True
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "inference-sidecar HTTP API", "version": __version__,
                 "description": "The sidecar's HTTP API; docs/api.md is its prose (tests check one against the other)."},
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description":
                                           "required on every endpoint but /healthz when the sidecar has a token"}},
            "schemas": {"Error": {
                "type": "object", "required": ["error", "message"],
                "properties": {"error": {"type": "string"}, "message": {"type": "string"},
                               "param": {"type": "string", "description": "bad_parameter: the parameter"},
                               "active": {"type": "string", "description": "the busy codes: the running job"}}}},
        },
    }


def _operation_id(method: str, path: str) -> str:
    words = [w.strip("{}") for w in path.strip("/").replace(".", "_").split("/")]
    return method.lower() + "_" + ("_".join(w.replace("-", "_") for w in words) or "home")  # "/": get_home


async def openapi_json(request: web.Request) -> web.Response:
    # Built on each request (it is small): from the routes as they are, the app being frozen by then.
    return web.json_response(build_document(request.app))
