"""docs/ against the code (issue #17): every metric, span, span attribute and JSON field the docs name is
one the code produces, and every one the code produces is documented, so the next drift fails here,
naming each name that drifted.

What the code produces is taken from the code running, never from its source text:

- metrics: the sidecar's ``/metrics`` (its own families, and what an engine process's real telemetry
  pushes to it, every instrument recorded once), and the OpenTelemetry instruments themselves (names
  and units, from an in-memory reader);
- spans: a request's span tree, a step span and capture spans (one a trigger started, one an alert)
  from a real ``Telemetry``, and the sidecar's own ``sync_scan``, ``trigger_firing`` and
  ``alert_firing`` from a scan and firings of the live sidecar below;
- JSON fields: the live sidecar's answers, with real probes in fake engine processes
  (tests/fake_engine.py, as tests/test_service.py): a slow step fires a trigger that saves the flight
  recorder, captures and scans; an Alertmanager notification fires an alert action that does the
  same, and skips an alert of another server; then a capture of one request, a capture and a scan
  stopped early.

What the docs say is read from the places that state it: docs/telemetry.md's Metrics and Spans tables
(both directions), every metric and dotted attribute name in backticks anywhere in docs/ and README.md,
the PromQL of dashboards/ and deploy/, and docs/api.md's JSON examples and field lists.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Union

import pytest
import yaml
from msgspec import structs
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from sidecar.common import auth
from sidecar.probe import flight_ring
from sidecar.service.incidents import recorder_view
from sidecar.probe.profile_header import BAGGAGE_KEY
from sidecar.common.protocol import SyncReport
from sidecar.service.metrics import sync_findings
from sidecar.service.incidents import triggers as triggers_module
from sidecar.service.incidents import alerts as alerts_module
from sidecar.service.incidents.alert_actions import parse_alert_actions_file
from sidecar.common.protocol import StartedBy
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.jobs.captures import BoundCaptureRequest
from sidecar.service.routes.keys import CAPTURES
from sidecar.service.metrics.otlp_translation import prometheus_name, series_of
from sidecar.telemetry import ClockOffset, FinishedRequest, Telemetry, TelemetrySettings, make_resource, record_request
from sidecar.telemetry.capture import CaptureRecord, record_capture
from sidecar.telemetry.gpu import GpuSampler
from sidecar.telemetry.push import CUMULATIVE
from sidecar.common.verdicts import FINAL

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")
PROBE_TOKEN = "probe-token-for-the-docs-test"


def drifted(what: str, problems: list[str]) -> str:
    return f"{what}: {len(problems)} name(s) drifted between docs and code:\n  " + "\n  ".join(problems)


# -- Markdown ---------------------------------------------------------------------------------------------

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
HEADING = re.compile(r"^(#{1,6}) (.*)$")


def prose(text: str) -> str:
    """``text`` without its fenced blocks."""
    return FENCE.sub("", text)


def code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", prose(text))


def section(text: str, title: str) -> str:
    """The section under the heading ``title`` (backticks ignored), up to the next heading of its level
    or higher; headings inside fenced blocks are no headings."""
    out: list[str] = []
    level, fenced = 0, False
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else HEADING.match(line.rstrip("\n"))
        if m and level and len(m.group(1)) <= level:
            break
        if level:
            out.append(line)
        elif m and m.group(2).replace("`", "").strip() == title:
            level = len(m.group(1))
    assert level, f"no heading {title!r}: the test reads that section"
    return "".join(out)


def table(text: str, first_header: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first Markdown table in ``text`` whose header starts with
    ``| first_header |``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"| {first_header} |"):
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                # split at the pipes outside backticks
                cells = re.findall(r"((?:`[^`]*`|[^|`])*)\|", row.strip()[1:])
                rows.append([c.strip() for c in cells])
            return rows
    raise AssertionError(f"no table with the header '| {first_header} |'")


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


# -- JSON as the docs write it ------------------------------------------------------------------------------
# docs/api.md gives JSON bodies either as JSON or in a shorthand: a key without a value ("since_ns") is a
# field not described further, `"key"?` an optional one, `{... as /processes ...}` or `[...]` a value
# described elsewhere, `a | null` alternatives. A shape is what that says: the keys of each object.

@dataclass
class Obj:
    keys: dict[str, "Shape"] = field(default_factory=dict)
    optional: set[str] = field(default_factory=set)
    is_map: bool = False  # its keys are data (file names), not fields


@dataclass
class Arr:
    item: "Shape" = None


Shape = Union[Obj, Arr, None]


def merge_shapes(a: Shape, b: Shape) -> Shape:
    if isinstance(a, Obj) and isinstance(b, Obj):
        keys = dict(a.keys)
        for k, v in b.keys.items():
            keys[k] = merge_shapes(keys.get(k), v)
        return Obj(keys, a.optional | b.optional)
    if isinstance(a, Arr) and isinstance(b, Arr):
        return Arr(merge_shapes(a.item, b.item))
    return a if a is not None else b


class _ShapeParser:
    def __init__(self, text: str) -> None:
        self.s, self.i = text, 0

    def parse(self) -> Shape:
        shape = self.value()
        self.ws()
        assert self.i == len(self.s), f"unparsed documented JSON from {self.s[self.i:self.i + 40]!r}"
        return shape

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def value(self) -> Shape:
        self.ws()
        c = self.peek()
        if c == "{":
            shape = self.obj()
        elif c == "[":
            shape = self.arr()
        elif c == '"':
            self.string()
            shape = None
        else:
            self.bare()
            shape = None
        self.ws()
        if self.peek() == "|":  # {"since_ns", "age_ms"} | null
            self.i += 1
            shape = merge_shapes(shape, self.value())
        return shape

    def string(self) -> str:
        start = self.i
        self.i += 1
        while self.s[self.i] != '"':
            self.i += 2 if self.s[self.i] == "\\" else 1
        self.i += 1
        return json.loads(self.s[start:self.i])

    def bare(self) -> None:
        """Text up to the next , ] or } of this level: a literal, "...", "... as /processes ...", "frame indexes"."""
        depth = 0
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in "([{":
                depth += 1
            elif c in ")]}":
                if not depth:
                    return
                depth -= 1
            elif c == "," and not depth:
                return
            self.i += 1

    def obj(self) -> Shape:
        self.i += 1
        shape, described_elsewhere = Obj(), False
        while True:
            self.ws()
            c = self.peek()
            if c == "}":
                self.i += 1
                break
            if c == '"':
                key = self.string()
                if self.peek() == "?":
                    shape.optional.add(key)
                    self.i += 1
                self.ws()
                child = None
                if self.peek() == ":":
                    self.i += 1
                    child = self.value()
                shape.keys[key] = merge_shapes(shape.keys.get(key), child)
            else:
                self.bare()
                described_elsewhere = True
            self.ws()
            if self.peek() == ",":
                self.i += 1
        return None if described_elsewhere and not shape.keys else shape

    def arr(self) -> Shape:
        self.i += 1
        item: Shape = None
        while True:
            self.ws()
            if self.peek() == "]":
                self.i += 1
                return Arr(item)
            item = merge_shapes(item, self.value())
            self.ws()
            if self.peek() == ",":
                self.i += 1


def shape(text: str) -> Shape:
    return _ShapeParser(text.strip()).parse()


def fields_drift(doc: Shape, values: list, path: str, unchecked_ok: frozenset = frozenset()) -> list[str]:
    """Each way, the fields where the JSON values the service returned at ``path`` and the documented
    ``doc`` differ. ``values``: every value found there (all the elements of every list on the way), so
    a field documented on some elements only, or returned by some only, is still compared."""
    out: list[str] = []
    if isinstance(doc, Obj):
        objects = [v for v in values if isinstance(v, dict)]
        if not objects:
            if path not in unchecked_ok:
                out.append(f"{path}: no object came back to compare with the documented one (the test's scenario "
                           f"must produce one)")
            return out
        if doc.is_map:
            return out
        returned = set().union(*objects)
        out += [f"{path}.{k}: returned, not documented" for k in sorted(returned - set(doc.keys))]
        out += [f"{path}.{k}: documented, never returned" for k in sorted(set(doc.keys) - returned - doc.optional)]
        for key, child in doc.keys.items():
            if child is not None:
                out += fields_drift(child, [o[key] for o in objects if key in o], f"{path}.{key}", unchecked_ok)
    elif isinstance(doc, Arr) and doc.item is not None:
        items = [x for v in values if isinstance(v, list) for x in v]
        out += fields_drift(doc.item, items, f"{path}[]", unchecked_ok)
    return out


# -- the live sidecar -----------------------------------------------------------------------------------------

async def _until(get, ok, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while True:
        body = await get()
        if ok(body):
            return body
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting for {what}: {body}")
        await asyncio.sleep(0.1)


DOCS_ALERT = "DocsAlertFired"


async def _live(tmp: Path, engine_push: bytes) -> dict[str, Any]:
    actions = parse_alert_actions_file(json.dumps([{"match": {"alertname": DOCS_ALERT}, "cooldown_s": 600,
                                                    "action": {"capture_steps": 2, "recorder_seconds": 10,
                                                               "sync_scan": True}}]), 50)
    app = make_app(ServiceSettings(trace_dir=tmp / "traces", probe_token=PROBE_TOKEN, http_token=None, max_steps=50,
                                   max_capture_bytes=1 << 30, keep=20, stop_grace_s=1.0, alert_actions=tuple(actions)))
    client = TestClient(TestServer(app))
    await client.start_server()
    url = str(client.make_url("")).rstrip("/")
    env = dict(os.environ, SIDECAR_ENDPOINT=url, SIDECAR_TOKEN=PROBE_TOKEN, SIDECAR_TOKEN_FILE=str(tmp / "none"),
               SIDECAR_TRACE_DIR=str(tmp / "probe-root"), SIDECAR_SYNC_TREAT_CPU_AS_DEVICE="1")
    procs = []
    out: dict[str, Any] = {}

    async def get(path: str, **kwargs):
        return await (await client.get(path, **kwargs)).json()

    async def answer(resp, status: int):
        assert resp.status == status, (resp.url, resp.status, await resp.text())
        return await resp.json()

    try:
        # A slow step (every 40th) fires this rule: recorder dump, capture, then a scan; the next is skipped.
        rule = {"metric": "step_duration", "threshold_ms": 300, "cooldown_s": 600,
                "action": {"capture_steps": 2, "recorder_seconds": 10, "sync_scan": True}}
        trigger = await answer(await client.post("/triggers", json=rule), 201)
        for args in (["worker", "--rank", "0", "--step-ms", "20", "--slow-step-at", "40", "--slow-step-ms", "400",
                      "--planted-sync", "--fake-cuda-watch", "4"], ["api_server"]):
            procs.append(subprocess.Popen([sys.executable, str(FAKE_ENGINE), *args], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        await _until(lambda: get("/processes"), lambda b: len(b["processes"]) == 2, "both processes to connect")
        fired = await _until(lambda: get(f"/triggers/{trigger['id']}"),
                             lambda b: any(f.get("capture") and f.get("scan") for f in b["firings"]), "a firing")
        firing = next(f for f in fired["firings"] if f.get("capture"))
        out["capture"] = await _until(lambda: get(f"/profile/{firing['capture']}"), lambda b: b["state"] in FINAL,
                                      "the trigger's capture")
        out["scan"] = await _until(lambda: get(f"/sync/{firing['scan']}"), lambda b: b["state"] in FINAL,
                                   "the trigger's scan")
        out["trigger"] = await _until(lambda: get(f"/triggers/{trigger['id']}"), lambda b: b["counts"]["skipped"],
                                      "a skipped firing")
        out["watch"] = await _until(lambda: get("/syncs/watch"), lambda b: b["sites"], "the sync watch's report")
        # Alertmanager's notification: one alert of this server fires (recorder, capture, scan), one of another is skipped.
        labels = {"alertname": DOCS_ALERT, "instance": f"127.0.0.1:{client.port}", "severity": "warning"}
        out["alerts_posted"] = await answer(await client.post("/alerts", json={"version": "4", "alerts": [
            {"status": "firing", "labels": labels, "startsAt": "2026-11-23T07:01:01.52Z", "fingerprint": "5e4bd1c6f2a3b7e0"},
            {"status": "firing", "labels": {**labels, "instance": "10.0.3.7:8787"}, "startsAt": "2026-11-23T07:01:01.52Z"},
        ]}), 200)
        alerted = await _until(lambda: get("/alerts"), lambda b: b["firings"] and b["firings"][0]["scan"], "the alert's firing")
        out["alert_capture"] = await _until(lambda: get(f"/profile/{alerted['firings'][0]['capture']}"),
                                            lambda b: b["state"] in FINAL, "the alert's capture")
        await _until(lambda: get(f"/sync/{alerted['firings'][0]['scan']}"), lambda b: b["state"] in FINAL, "the alert's scan")
        out["alerts"] = await get("/alerts")
        # A capture of one request (as request_captures.py starts it), read while it runs, then stopped.
        bound = await app[CAPTURES].start(BoundCaptureRequest(steps=2, request_id="cmpl-1-0", asked_by=firing["process"]))
        out["bound_capture"] = await get(f"/profile/{bound.id}")
        await client.post("/profile/stop")
        await _until(lambda: get(f"/profile/{bound.id}"), lambda b: b["state"] in FINAL, "the stopped capture")
        # A capture and a scan started and stopped over HTTP.
        out["capture_started"] = await answer(await client.post("/profile/start", params={"steps": "50"}), 202)
        out["capture_stopped"] = await answer(await client.post("/profile/stop"), 200)
        out["scan_started"] = await answer(await client.post("/sync/start", params={"steps": "50"}), 202)
        out["scan_stopped"] = await answer(await client.post("/sync/stop"), 200)
        await _until(lambda: get(f"/sync/{out['scan_stopped']['id']}"), lambda b: b["state"] in FINAL, "the stopped scan")
        out["profiles"] = await get("/profiles")
        out["syncs"] = await get("/syncs")
        out["processes"] = await get("/processes")
        out["healthz"] = await get("/healthz")
        out["recorder"] = await get("/recorder", params={"seconds": "60"})
        out["requests"] = await get("/requests")
        out["triggers"] = await get("/triggers")
        push = await client.post("/v1/metrics", data=engine_push, headers={
            "Content-Type": "application/x-protobuf", **auth.push_headers(PROBE_TOKEN, engine_push, time.time())})
        assert push.status == 200, await push.text()
        out["metrics"] = await (await client.get("/metrics")).text()
        out["trigger_deleted"] = await answer(await client.delete(f"/triggers/{trigger['id']}"), 200)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        await client.close()
    return out


# -- an engine process's telemetry, in this process -------------------------------------------------------------

class FakeNvml:
    """NVML as nvidia-ml-py gives it, for one GPU: the GPU sampler's real code runs on it."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetUUID(self, h): return "GPU-00000000-0000-0000-0000-000000000000"
    def nvmlDeviceGetName(self, h): return "Fake GPU"
    def nvmlDeviceGetUtilizationRates(self, h): return SimpleNamespace(gpu=50)
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(used=1 << 30, total=8 << 30)
    def nvmlDeviceGetPowerUsage(self, h): return 100_000
    def nvmlDeviceGetTemperature(self, h, sensor): return 50


def _engine_telemetry():
    """Every instrument and span an engine process makes, each once with every optional attribute:
    (finished spans, metrics data)."""
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader(preferred_temporality=CUMULATIVE)
    telemetry = Telemetry(TelemetrySettings(step_spans_ratio=1.0, span_schedule_delay_ms=10),
                          make_resource("worker", 0), span_exporter=spans, metric_readers=[reader])
    try:
        telemetry.start_samplers(process=True, gpu=False)
        GpuSampler.create(telemetry.meter, FakeNvml()).sample()
        now = time.time_ns()
        telemetry.step_recorder("worker").observe(now, now + 1_000_000, batch_size=2, tokens=9)
        clock = ClockOffset.measure()
        arrival = time.time() - 1
        mono = arrival - clock.wall_minus_monotonic
        full = dict(model="tiny", operation="chat", arrival_time=arrival, finished_time=arrival + 0.5,
                    queued_ts=mono + 0.01, scheduled_ts=mono + 0.02, first_token_ts=mono + 0.05, last_token_ts=mono + 0.4,
                    time_to_first_token=0.05, input_tokens=7, output_tokens=5, cached_input_tokens=4, preemptions=1,
                    max_tokens=16, temperature=0.5, top_p=0.9)
        captured = record_request(FinishedRequest(request_id="chatcmpl-1", finish_reason="stop",
                                                  capture_id="20261123-000000-abcdef",
                                                  capture_url="http://127.0.0.1:8787/profile/20261123-000000-abcdef",
                                                  **full), telemetry.tracer, telemetry.requests, clock, provider="vllm")
        in_flight = record_request(FinishedRequest(request_id="chatcmpl-2", finish_reason="abort",
                                                   capture_skipped="busy: capture 20261123-000000-abcdef is capturing",
                                                   **full), telemetry.tracer, telemetry.requests, clock, provider="vllm")
        record_capture(CaptureRecord("20261123-000000-abcdef", "failed", arrival, arrival + 1, steps=3, processes=2,
                                     bytes=1000, trace_url="http://127.0.0.1:8787/profile/20261123-000000-abcdef/trace",
                                     error="a process was lost", request_id="chatcmpl-1"),
                       telemetry.tracer, in_flight=[in_flight], captured=captured)
        # Captures that a trigger and an Alertmanager alert started name them (the verdict's started_by).
        for cause in (StartedBy(kind="trigger", name="step_duration step > 1000 ms", id="trg-3f9a1c2e"),
                      StartedBy(kind="alert", name="InferenceTimeToFirstTokenHigh", id="5e4bd1c6f2a3b7e0",
                                starts_at="2026-11-23T07:01:01.52Z", labels={"alertname": "InferenceTimeToFirstTokenHigh"})):
            record_capture(CaptureRecord("20261123-000000-abcdef", "done", arrival, arrival + 1, steps=3, processes=2,
                                         bytes=1000, started_by=cause), telemetry.tracer)
        telemetry.run_tasks_once()
        telemetry.span_processor.force_flush()
        return list(spans.get_finished_spans()), reader.get_metrics_data()
    finally:
        telemetry.shutdown()


@dataclass
class Code:
    """What the code produced."""

    live: dict[str, Any]
    spans: list  # ReadableSpan: the engine's and the sidecar's
    instruments: dict[str, str]  # OpenTelemetry instrument name -> unit
    point_attributes: set[str]  # attribute keys of the instruments' data points
    resource_attributes: set[str]
    prometheus_family: dict[str, str]  # OpenTelemetry instrument name -> its family at /metrics
    families: dict[str, str] = field(default_factory=dict)  # family at /metrics -> type
    labels: dict[str, set[str]] = field(default_factory=dict)  # family -> its label names

    @property
    def samples(self) -> dict[str, str]:
        """Every sample name /metrics serves -> its family (a family with no sample yet: by its type)."""
        out = {}
        for name, kind in self.families.items():
            for suffix in {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(kind, ("",)):
                out[name + suffix] = name
        return out

    @property
    def all_labels(self) -> set[str]:
        return set().union(*self.labels.values())


@pytest.fixture(scope="module")
def code(tmp_path_factory) -> Code:
    engine_spans, data = _engine_telemetry()
    sidecar_spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(sidecar_spans))
    with pytest.MonkeyPatch.context() as mp:  # the sidecar's spans go to the global tracer: this one stands in
        for module in (triggers_module, alerts_module, sync_findings):
            mp.setattr(module.trace, "get_tracer", lambda *a, **k: provider.get_tracer("test"))
        live = asyncio.run(_live(tmp_path_factory.mktemp("docs-live"), encode_metrics(data).SerializeToString()))
    metrics = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    otlp = encode_metrics(data)
    result = Code(
        live=live, spans=engine_spans + list(sidecar_spans.get_finished_spans()),
        instruments={m.name: m.unit for m in metrics},
        point_attributes={k for m in metrics for p in m.data.data_points for k in p.attributes},
        resource_attributes={k for rm in data.resource_metrics for k in rm.resource.attributes},
        prometheus_family={m.name: prometheus_name(series_of(m, {}))
                           for rm in otlp.resource_metrics for sm in rm.scope_metrics for m in sm.metrics})
    for family in text_string_to_metric_families(live["metrics"]):
        result.families[family.name] = family.type
        result.labels[family.name] = {k for s in family.samples for k in s.labels}
    return result


# -- metrics ---------------------------------------------------------------------------------------------------

METRIC_DOCS = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
# A metric name in backticks: the sidecar's, the GenAI conventions', the hardware and process ones,
# with the docs' shorthands `name_*` and `name_{bucket,sum,count}`; not inside a path or a Python name.
METRIC_TOKEN = re.compile(r"(?<![\w/.])((?:sidecar|gen_ai|hw|process)_[a-z0-9_]*[a-z0-9](?:_\*|_\{[a-z,]+\})?|target_info)"
                          r"(?![\w/.(])")
# Written like a metric, and no metric: what these names are.
NOT_METRICS = {
    "sidecar_token": "the compose file's secret",
    "sidecar_nonce": "a value of the probe handshake (docs/api.md)",
    "sidecar_vllm": "the vLLM plugin's package", "sidecar_sglang": "the SGLang plugin's package",
    "process_batch_result": "an SGLang function", "process_batch_result_prefill": "an SGLang function",
    "process_batch_result_decode": "an SGLang function", "process_batch_result_idle": "an SGLang function",
    "process_batch_result_*": "SGLang functions",
    "process_input_requests": "an SGLang function", "process_name": "a Chrome trace's metadata event",
}
# Labels Prometheus adds to every scraped series, and a histogram bucket's bound.
SCRAPE_LABELS = {"instance", "job", "le"}


def _expand(token: str) -> list[str]:
    m = re.fullmatch(r"(.*)_\{([a-z,]+)\}", token)
    return [f"{m.group(1)}_{part}" for part in m.group(2).split(",")] if m else [token]


def _resolves(name: str, code: Code) -> bool:
    if name.endswith("_*"):
        return any(s.startswith(name[:-1]) for s in code.samples)
    return name in code.samples or name in code.families or name in code.all_labels


def _documented_metric_tokens(path: Path) -> list[tuple[str, str]]:
    """(name, the backticked text it is in) for every metric-like name in ``path``'s prose."""
    out = []
    for span in code_spans(path.read_text()):
        for m in METRIC_TOKEN.finditer(span):
            out.extend((name, span) for name in _expand(m.group(1)) if name not in NOT_METRICS)
    return out


def test_every_metric_the_docs_name_is_one_the_sidecar_serves(code):
    problems = []
    for path in METRIC_DOCS:
        for name, span in _documented_metric_tokens(path):
            if not _resolves(name, code):
                problems.append(f"{path.relative_to(ROOT)}: `{span}`: {name} is no metric, sample or label /metrics serves")
            # `name{a, b}`: the labels it says that metric has.
            for m in re.finditer(r"([a-z_]+)\{([^}]*)\}", span):
                family = code.samples.get(m.group(1))
                if family is None:
                    continue
                said = {re.split(r"[=!~]", part)[0].strip() for part in m.group(2).split(",") if part.strip()}
                for label in sorted(said - code.labels[family] - SCRAPE_LABELS):
                    problems.append(f"{path.relative_to(ROOT)}: `{span}`: {m.group(1)} has no label {label} "
                                    f"(it has {sorted(code.labels[family])})")
    assert not problems, drifted("metric names in docs/ and README.md", sorted(set(problems)))


def _telemetry_metrics_section() -> str:
    return section((DOCS / "telemetry.md").read_text(), "Metrics")


def test_every_metric_the_sidecar_serves_is_in_telemetry_md(code):
    documented = set()
    for span in code_spans(_telemetry_metrics_section()):
        for m in METRIC_TOKEN.finditer(span):
            documented.update(_expand(m.group(1)))
    problems = []
    for family, kind in sorted(code.families.items()):
        base = family[:-len("_created")] if family.endswith("_created") else None
        if code.families.get(base) in ("counter", "histogram"):
            # prometheus_client's creation time of each series of the sidecar's own counters and histograms
            if "`*_created`" not in _telemetry_metrics_section():
                problems.append(f"{family}: prometheus_client's `*_created` series, not mentioned in docs/telemetry.md")
            continue
        names = {s for s, f in code.samples.items() if f == family} | {family}
        wildcards = {d[:-1] for d in documented if d.endswith("_*")}
        if not names & documented and not any(n.startswith(w) for n in names for w in wildcards):
            problems.append(f"{family} ({kind}, labels {sorted(code.labels[family])}): served at /metrics, "
                            f"not in docs/telemetry.md's Metrics section")
    assert not problems, drifted("/metrics against docs/telemetry.md", problems)


def test_the_metrics_table_names_every_instrument_with_its_unit_and_prometheus_name(code):
    problems, named = [], set()
    for cells in table(_telemetry_metrics_section(), "OpenTelemetry name"):
        names = [t for t in ticked(cells[0]) if "=" not in t]
        units = [u.strip() for u in cells[1].split(" / ")] if cells[1] else []
        prometheus = {n for t in ticked(cells[2]) for m in METRIC_TOKEN.finditer(t) for n in _expand(m.group(1))}
        for i, name in enumerate(names):
            named.add(name)
            if name not in code.instruments:
                problems.append(f"{name}: in the table, no instrument of the code")
                continue
            unit = units[i] if len(units) == len(names) else units[0] if units else ""
            if unit != code.instruments[name]:
                problems.append(f"{name}: the table says unit {unit!r}, the instrument has {code.instruments[name]!r}")
            family = code.prometheus_family[name]
            if not any(code.samples.get(p) == family or p.rstrip("*").rstrip("_") == family for p in prometheus):
                problems.append(f"{name}: becomes {family} at /metrics; the table's row says {sorted(prometheus)}")
    problems += [f"{name}: an instrument of the code, not in the table" for name in sorted(set(code.instruments) - named)]
    assert not problems, drifted("docs/telemetry.md's Metrics table", problems)


def _promql_names(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) a PromQL expression uses."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges, subqueries, Grafana's $__rate_interval
    labels: set[str] = set()
    for m in re.finditer(r"\{([^}]*)\}", expr):
        labels.update(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", m.group(1)))
    expr = re.sub(r"\{[^}]*\}", "", expr)
    for m in re.finditer(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels.update(x.strip() for x in m.group(1).split(",") if x.strip())
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    keywords = {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left",
                "group_right", "inf", "nan"}
    metrics = {m.group(1) for m in re.finditer(r"(?<![\w.$])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", expr)
               if m.group(1) not in keywords}
    return metrics, labels


def _queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every panel and annotation of the dashboard and every alerting rule, and the
    series of the rules' unit tests."""
    out = []
    dashboard = json.loads((ROOT / "dashboards/inference-sidecar.json").read_text())
    for panel in dashboard["panels"]:
        out += [(f"dashboard panel {panel.get('title')!r}", t["expr"]) for t in panel.get("targets", [])]
    out += [(f"dashboard annotation {a['name']!r}", a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    for group in yaml.safe_load((ROOT / "deploy/alerts.yml").read_text())["groups"]:
        for rule in group["rules"]:
            out.append((f"deploy/alerts.yml {rule['alert']}", rule["expr"]))
            text = json.dumps(rule.get("annotations", {}))
            out += [(f"deploy/alerts.yml {rule['alert']} annotations", f'x{{{label}=""}}')
                    for label in re.findall(r"\$labels\.(\w+)", text)]
    for test in yaml.safe_load((ROOT / "deploy/alerts_test.yml").read_text())["tests"]:
        out += [("deploy/alerts_test.yml input_series", s["series"]) for s in test.get("input_series", [])]
    return out


def test_dashboards_and_alerts_query_only_what_the_sidecar_serves(code):
    problems = []
    for where, expr in _queries():
        metrics, labels = _promql_names(expr)
        for name in sorted(metrics - {"x"}):
            if name not in code.samples:
                problems.append(f"{where}: {name} is not served at /metrics")
        for label in sorted(labels - code.all_labels - SCRAPE_LABELS):
            problems.append(f"{where}: no series at /metrics has a label {label}")
    assert not problems, drifted("dashboards/ and deploy/ queries", problems)


# -- spans ---------------------------------------------------------------------------------------------------------

@dataclass
class SpanFacts:
    kind: set[str] = field(default_factory=set)
    attributes: set[str] = field(default_factory=set)
    events: dict[str, set[str]] = field(default_factory=dict)
    links: set[str] = field(default_factory=set)


def _documented_spans() -> dict[str, SpanFacts]:
    """docs/telemetry.md's table of spans: name (a template such as `{sidecar.process.role} step`) -> facts.
    The attributes cell lists the span's attributes, then `; event `NAME`: ...` and `; links: ...`."""
    out: dict[str, SpanFacts] = {}
    for cells in table(section((DOCS / "telemetry.md").read_text(), "Spans"), "span"):
        name, kind, cell = ticked(cells[0])[0], cells[1], cells[-1]
        facts = out.setdefault(name, SpanFacts())
        facts.kind.add(kind)
        for part in cell.split(";"):
            names = [t.split("=")[0] for t in ticked(part) if "." in t]
            event = re.match(r"\s*events? `([^`]+)`:", part)
            if event:
                facts.events.setdefault(event.group(1), set()).update(names)
            elif re.match(r"\s*links?:", part):
                facts.links.update(names)
            else:
                facts.attributes.update(names)
    return out


def _code_spans(code: Code, templates: list[str]) -> dict[str, SpanFacts]:
    out: dict[str, SpanFacts] = {}
    for span in code.spans:
        attrs = dict(span.attributes)
        name = span.name
        # A documented name made of attributes (`{gen_ai.operation.name} {gen_ai.request.model}`) stands for
        # every span whose name those attributes make.
        for template in templates:
            keys = re.findall(r"\{([^}]+)\}", template)
            if keys and all(k in attrs for k in keys):
                if re.sub(r"\{([^}]+)\}", lambda m: str(attrs[m.group(1)]), template) == name:
                    name = template
        facts = out.setdefault(name, SpanFacts())
        facts.kind.add(span.kind.name)
        facts.attributes.update(attrs)
        for event in span.events:
            facts.events.setdefault(event.name, set()).update(event.attributes)
        for link in span.links:
            facts.links.update(link.attributes)
    return out


def test_every_span_and_attribute_in_telemetry_md_is_what_the_code_emits(code):
    documented = _documented_spans()
    emitted = _code_spans(code, list(documented))
    problems = [f"span {n!r}: documented, never emitted" for n in sorted(set(documented) - set(emitted))]
    problems += [f"span {n!r}: emitted, not in docs/telemetry.md's table" for n in sorted(set(emitted) - set(documented))]
    for name in sorted(set(documented) & set(emitted)):
        doc, got = documented[name], emitted[name]
        if doc.kind != got.kind:
            problems.append(f"span {name!r}: kind {sorted(doc.kind)} documented, {sorted(got.kind)} emitted")
        for what, d, g in [("attribute", doc.attributes, got.attributes), ("link attribute", doc.links, got.links)]:
            problems += [f"span {name!r}: {what} {a} emitted, not documented" for a in sorted(g - d)]
            problems += [f"span {name!r}: {what} {a} documented, never emitted" for a in sorted(d - g)]
        for event in sorted(set(doc.events) | set(got.events)):
            if event not in got.events or event not in doc.events:
                problems.append(f"span {name!r}: event {event!r} " + ("documented, never emitted" if event in doc.events
                                                                     else "emitted, not documented"))
                continue
            problems += [f"span {name!r} event {event!r}: attribute {a} emitted, not documented"
                         for a in sorted(got.events[event] - doc.events[event])]
            problems += [f"span {name!r} event {event!r}: attribute {a} documented, never emitted"
                         for a in sorted(doc.events[event] - got.events[event])]
    assert not problems, drifted("docs/telemetry.md's spans", problems)


# A dotted name in backticks that reads as an attribute or instrument name (`gen_ai.usage.input_tokens`,
# `sidecar.capture.id`, `hw.type=gpu`, `sidecar.step.*`), and no file name.
DOTTED = re.compile(r"^((?:gen_ai|sidecar|error|code|hw|process|service)(?:\.[a-z0-9_]+)+)(\.\*)?(?:=.*)?$")


def _python_name(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_name_in_the_docs_is_an_attribute_or_instrument_of_the_code(code):
    known = set(code.instruments) | code.point_attributes | code.resource_attributes | {BAGGAGE_KEY}
    for facts in _code_spans(code, []).values():
        known |= facts.attributes | facts.links | set().union(*facts.events.values(), set())
    problems = []
    for path in METRIC_DOCS:
        for span in code_spans(path.read_text()):
            m = DOTTED.match(span.strip())
            if not m or m.group(1).endswith(("_py", "_md")):
                continue
            name, wildcard = m.group(1), m.group(2)
            ok = (any(k.startswith(name + ".") for k in known) if wildcard
                  else name in known or _python_name(name))
            if not ok:
                problems.append(f"{path.relative_to(ROOT)}: `{span}`: no attribute, instrument or Python name of the code")
    assert not problems, drifted("dotted names in docs/ and README.md", sorted(set(problems)))


# -- JSON fields --------------------------------------------------------------------------------------------------

API_MD = DOCS / "api.md"


def _api(title: str) -> str:
    return section(API_MD.read_text(), title)


def _fenced(text: str) -> str:
    m = FENCE.search(text)
    assert m, "no fenced block where the test reads a documented body"
    return m.group(2)


def _inline(text: str, pattern: str) -> str:
    """The first inline code span of ``text`` matching ``pattern``, less a leading status (``202 {...}``)."""
    for span in code_spans(text):
        if re.match(pattern, span):
            return re.sub(r"^\d{3} ", "", span)
    raise AssertionError(f"no inline code matching {pattern!r} where the test reads a documented body")


def _capture_shape() -> Obj:
    text = _api("GET /profile/{id}")
    capture = shape(_fenced(text))
    capture.keys["files"] = Obj(is_map=True)
    capture.keys["start_steps"] = Obj(is_map=True)  # keyed by engine instance
    # "`trigger` is null for a capture a client started; for one a trigger started, the firing: `trigger` (its id), ..."
    paragraph = next(p for p in map(str.strip, prose(text).split("\n\n")) if p.startswith("`trigger` is null"))
    listed = paragraph.split(":", 1)[1].split("(see")[0]
    capture.keys["trigger"] = Obj({name: None for name in ticked(listed)})
    # "`alert` is null but for a capture an Alertmanager alert started: `name` (its `alertname`), `labels`, ..."
    paragraph = next(p for p in map(str.strip, prose(text).split("\n\n")) if "`alert` is null" in p)
    listed = re.sub(r"\([^)]*\)", "", paragraph.split("alert started:", 1)[1].split("(see")[0])  # less (its `startsAt`)
    capture.keys["alert"] = Obj({name: None for name in ticked(listed)})
    capture.keys["alert"].keys["labels"] = Obj(is_map=True)
    request = next(p for p in prose(text).split("\n\n") if "`request` is null" in p)
    capture.keys["request"] = shape(_inline(request, r"\{"))
    return capture


def _recorder_built_here() -> dict:
    """The recorder's answer for a process with a row of everything: a step, an open step, a GC pause, a
    finished request and one in flight (the fake engines of the live sidecar record no requests)."""
    now = time.time_ns()
    from sidecar.probe.gpu_memory import GpuMemory

    gpu = GpuMemory(lambda: (1 << 20, 2 << 20), max_step_ns=10**9, trials=1)  # a process with CUDA's columns
    gpu.decide()
    steps = flight_ring.StepRing(8, gpu)
    steps.begin(now - 3_000_000)
    steps.end(7, True, batch=2, tokens=9, prefill_tokens=5, decode_tokens=4, running=2, waiting=1, now_ns=now - 2_000_000)
    steps.begin(now - 1_000_000)
    gc_pauses = flight_ring.GcPauses(8, min_pause_ns=0)
    gc_pauses._on_gc("start", {})
    gc_pauses._on_gc("stop", {"generation": 0, "collected": 3})
    finished = flight_ring.RequestRing(8)
    finished.add("cmpl-1", now - 9_000_000, now - 8_000_000, now - 4_000_000, "finished", 7, 5)
    dump = {"steps": steps.dump(), "gc": gc_pauses.dump(), "requests": finished.dump(),
            "in_flight": [{"id": "cmpl-2", "arrived_ns": now - 5_000_000, "phase": "decode", "prompt_tokens": 3,
                           "output_tokens": 1}]}
    return recorder_view.merge([({"label": "worker rank 0 (pid 1)", "pid": 1}, dump, None)], now - 10_000_000, now)


def _bodies(code: Code) -> list[tuple[str, Shape, list, frozenset]]:
    """(endpoint, documented shape, bodies the service returned, paths it cannot fill here)."""
    live = code.live
    capture, scan = _capture_shape(), shape(_fenced(_api("GET /sync/{id}")))
    triggers = _api("Triggers: a slow server captures itself")
    trigger = shape(_fenced(section(triggers, "POST /triggers")))
    listed = shape(_inline(section(triggers, "GET /triggers"), r"\{"))
    if isinstance(listed, Obj) and isinstance(listed.keys.get("triggers"), Arr):
        # "every trigger as above, without `firings`"
        listed.keys["triggers"] = Arr(Obj({k: v for k, v in trigger.keys.items() if k != "firings"}))
    profiles = shape(_inline(_api("GET /profiles"), r"\{"))
    profiles.keys["captures"] = Arr(capture)  # "the same objects as /profile/{id}"
    syncs = shape(_inline(_api("GET /syncs"), r"\{"))
    syncs.keys["scans"] = Arr(scan)
    alerts = _api("Alerts: Alertmanager as a trigger")
    listed_alerts = shape(_fenced(section(alerts, "GET /alerts")))
    for key, nested in (("actions", "match"), ("firings", "alert"), ("skipped", "alert")):  # label maps: data, not fields
        item = listed_alerts.keys[key].item
        if nested == "match":
            item.keys["match"] = Obj(is_map=True)
        else:
            item.keys["alert"].keys["labels"] = Obj(is_map=True)
    return [
        ("GET /profile/{id}", capture, [live["capture"], live["bound_capture"], live["alert_capture"]], frozenset()),
        ("GET /profiles", profiles, [live["profiles"]], frozenset()),
        ("POST /profile/start", shape(_inline(_api("GET|POST /profile/start"), r"202 \{")), [live["capture_started"]],
         frozenset()),
        ("POST /profile/stop", shape(_inline(_api("POST /profile/stop"), r"200 \{")), [live["capture_stopped"]],
         frozenset()),
        ("GET /sync/{id}", scan, [live["scan"]], frozenset()),
        ("GET /syncs", syncs, [live["syncs"]], frozenset()),
        ("POST /sync/start", shape(_inline(_api("GET|POST /sync/start"), r"202 \{")), [live["scan_started"]], frozenset()),
        ("POST /sync/stop", shape(_inline(_api("POST /sync/stop"), r"200 \{")), [live["scan_stopped"]], frozenset()),
        ("GET /syncs/watch", shape(_fenced(_api("GET /syncs/watch"))), [live["watch"]], frozenset()),
        ("GET /recorder", shape(_fenced(_api("GET /recorder"))), [live["recorder"], _recorder_built_here()],
         frozenset()),
        # Its rows come from the engine's scheduler (vLLM's, plugins/sidecar_vllm/requests_view.py): the
        # fake engines have none; tests/e2e reads them from a real vLLM.
        ("GET /requests", shape(_fenced(_api("GET /requests"))), [live["requests"]], frozenset({"$.requests[]"})),
        ("GET /processes", shape(_inline(_api("GET /processes"), r'\{"processes"')), [live["processes"]], frozenset()),
        # No step here runs past a watchdog.
        ("GET /healthz", shape(_inline(_api("GET /healthz"), r'\{"status"')), [live["healthz"]], frozenset({"$.stuck[]"})),
        ("GET /triggers/{id}", trigger, [live["trigger"]], frozenset()),
        ("GET /triggers", listed, [live["triggers"]], frozenset()),
        ("DELETE /triggers/{id}", shape(_inline(section(triggers, "DELETE /triggers/{id}"), r"200 \{")),
         [live["trigger_deleted"]], frozenset()),
        ("POST /alerts", shape(_fenced(section(alerts, "POST /alerts"))), [live["alerts_posted"]], frozenset()),
        ("GET /alerts", listed_alerts, [live["alerts"]], frozenset()),
    ]


def test_every_json_field_in_api_md_is_what_the_service_returns(code):
    problems = []
    for endpoint, doc, bodies, unchecked_ok in _bodies(code):
        problems += [f"{endpoint}: {p}" for p in fields_drift(doc, bodies, "$", unchecked_ok)]
    assert not problems, drifted("docs/api.md's JSON bodies", problems)


def test_the_sync_report_in_syncs_md_is_the_protocol_message(code):
    """docs/syncs.md's example of a probe's ``sync`` message: its fields are SyncReport's (those the example
    leaves out are named in the text above it), its sites' fields those of the scan's sites (less
    ``processes``, which the sidecar's merge adds, as the text says)."""
    text = section((DOCS / "syncs.md").read_text(), "Report")
    example = shape(_fenced(text))
    fields = {f.encode_name for f in structs.fields(SyncReport)} | {"type"}
    problems = [f"{k}: in the example, not a field of SyncReport" for k in sorted(set(example.keys) - fields)]
    named = set(ticked(prose(text)))
    problems += [f"{k}: a field of SyncReport, neither in the example nor named in the text"
                 for k in sorted(fields - set(example.keys) - named)]
    sites = [{k: v for k, v in s.items() if k != "processes"} for s in code.live["scan"]["sites"]]
    problems += fields_drift(example.keys["sites"], [sites], "sites")
    assert not problems, drifted("docs/syncs.md's sync report", problems)
