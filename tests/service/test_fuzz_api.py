"""A property-based fuzz of every operation of ``GET /openapi.json`` (issue #10, "make the suite find the
next ones"): query strings made from each operation's documented parameters, valid values and hostile
ones (other scripts' digits, huge numbers, empty, NaN, long strings, unknown names, repeated names), path
parameters, and bodies (JSON objects, forms, random bytes under random Content-Type, charset and
Content-Encoding). Whatever is sent: no 5xx, every answer of 400 or more is JSON ``{"error", "message"}``
(docs/api.md, Errors), and the sidecar is healthy afterwards.

The app runs under ``JsonErrorsRunner`` (sidecar serve's own runner), so that what aiohttp's HTTP parser
refuses is JSON too, with fake probes connected (a worker and an engine core that answer arm and stop as
real ones do), so that starts can succeed; a job that started is stopped before the next example. The
probe channel (``x-websocket``) is not fuzzed here (tests/service/test_probe_channel.py covers it).

Bounded and reproducible: ``derandomize=True`` gives the same examples on every run (CI reproducible:
a failure seen once is seen again), ``database=None`` writes nothing, ``deadline=None`` because this
machine is slow and shared, and ``max_examples`` per operation keeps the whole file near a minute.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import tempfile
import zlib
from pathlib import Path
from urllib.parse import quote

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings, strategies as st

from sidecar import config
from sidecar.protocol import Answer, Arm, CaptureReport, Query, Stop, SyncArm, SyncReport
from sidecar.protocol import MODEL_EXTRA, ModuleArm, ModuleReport
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.keys import JOBS, QUERIES, REGISTRY
from sidecar.service.openapi import build_document
from sidecar.service.params import BOOLEAN_OPTIONS
from sidecar.service.serving import JsonErrorsRunner

from service_fakes import FakeWebSocket, identity

MAX_STEPS = 50


def service_settings(trace_dir: Path) -> ServiceSettings:
    return ServiceSettings(trace_dir=trace_dir, probe_token="probe-token-for-these-tests", http_token=None,
                           max_steps=MAX_STEPS, max_capture_bytes=1 << 30, keep=3, stop_grace_s=0.5)


def _document() -> dict:
    scratch = tempfile.mkdtemp()
    try:
        return build_document(make_app(service_settings(Path(scratch) / "traces")))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


DOCUMENT = _document()
OPERATIONS = [(method.upper(), path, op) for path, item in sorted(DOCUMENT["paths"].items())
              for method, op in sorted(item.items()) if not op.get("x-websocket")]
START_PATHS = {"/profile/start", "/sync/start", "/modules/start"}
# Start parameters whose valid values are valid together (stack_hz needs stacks, activities=cuda a CUDA
# process, processes=api_server alone selects no stepping process, baseline an earlier scan).
COMBINE_FREELY = {"steps", "delay", "timeout_s", "stacks", *BOOLEAN_OPTIONS}


# -- the sidecar, with probes ------------------------------------------------------------------------------

class AnsweringProbe(FakeWebSocket):
    """A step-driven probe on the app's registry: "armed" at arm, "failed" (no step) at a stop, as a real
    one answers before its first step (tests/service/test_cancel_routes.py has the API server's too)."""

    def __init__(self, app, role: str, rank: int | None) -> None:
        super().__init__()
        self._app = app
        self._tasks: set[asyncio.Task] = set()
        self._report: dict[str, type] = {}
        ident = identity(role, rank)
        if role == "worker":  # a worker whose probe knows its model: module timing runs there
            ident = msgspec.structs.replace(ident, extra={MODEL_EXTRA: True})
        self.conn = app[REGISTRY].add(ident, self)

    async def send_str(self, text: str) -> None:
        await super().send_str(text)
        msg = self.sent.pop()  # keep nothing: hundreds of examples
        if isinstance(msg, (Arm, SyncArm, ModuleArm)):
            kind = self._report[msg.spec.id] = {Arm: CaptureReport, SyncArm: SyncReport, ModuleArm: ModuleReport}[type(msg)]
            self._answer(kind, msg.spec.id, "armed", steps_seen=100)
        elif isinstance(msg, Stop) and (kind := self._report.pop(msg.job_id, None)) is not None:
            self._answer(kind, msg.job_id, "failed", error=f"no step recorded before the job ended ({msg.reason})")
        elif isinstance(msg, Query):
            self._app[QUERIES].on_answer(self.conn, self._answer_query(msg))

    @staticmethod
    def _answer_query(query: Query) -> Answer:
        """What a real probe of a process with no recorder, no threads and no requests would answer."""
        if query.kind == "requests":
            return Answer(query_id=query.query_id, kind=query.kind, data={"known": False, "requests": []})
        if query.kind == "stacks" and query.seconds <= 0:
            return Answer(query_id=query.query_id, kind=query.kind, data={"taken_ns": 1, "threads": []})
        if query.kind == "stacks":
            return Answer(query_id=query.query_id, kind=query.kind, data={
                "seconds": query.seconds, "hz": query.hz, "samples": 0, "frames": [], "stacks": [],
                "truncated": False})
        return Answer(query_id=query.query_id, kind=query.kind, error="no flight recorder in this fake")

    def _answer(self, kind: type, job_id: str, state: str, **fields) -> None:
        task = asyncio.get_running_loop().create_task(
            self._app[JOBS].on_report(self.conn, kind(job_id=job_id, state=state, **fields)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class JsonErrorsTestServer(TestServer):
    async def _make_runner(self, **kwargs):
        return JsonErrorsRunner(self.app, **kwargs)


class Sidecar:
    """The app on a loop of its own: hypothesis drives a plain function, each example one request."""

    def __init__(self, trace_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.app = make_app(service_settings(trace_dir))
        self.client = self.loop.run_until_complete(self._client())
        self.probes = [AnsweringProbe(self.app, "worker", 0), AnsweringProbe(self.app, "engine_core", None)]
        self.ids: list[str] = []  # of jobs started: path parameters that exist
        self.started = 0

    async def _client(self) -> TestClient:
        client = TestClient(JsonErrorsTestServer(self.app))  # made on the running loop: aiohttp needs one
        await client.start_server()
        return client

    def request(self, method: str, url: str, body: bytes | None, headers: dict[str, str]):
        return self.loop.run_until_complete(self._request(method, url, body, headers))

    async def _request(self, method, url, body, headers):
        async with self.client.request(method, url, data=body, headers=headers) as resp:
            return resp.status, resp.content_type, await resp.read()

    def stop_jobs(self) -> None:
        for path in ("/profile/stop", "/sync/stop", "/modules/stop"):
            status, _, raw = self.request("POST", path, None, {})
            assert status in (200, 409), (path, status, raw)

    def close(self) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()


@pytest.fixture
def sidecar(tmp_path):
    s = Sidecar(tmp_path / "traces")
    yield s
    s.close()


# -- what is sent ------------------------------------------------------------------------------------------

HOSTILE_VALUES = [
    "", " ", "0", "-1", "+5", " 5 ", "1_0", "\u0665", "\uff11\uff12", "\u00b2", "\u0e51", "inf", "-inf", "nan",
    "NaN", "Infinity", "1e999", "-1e999", "1e-999", "0x10", "5.", ".5", "1e2", "9" * 5000, "1" + "0" * 400,
    "\x00", "true", "none", "cpu,,cuda", ",", ":", "worker:", "worker:-1", "worker:\u0661", "WORKER", "api-server",
    "../../etc/passwd", "%ff", "\U0001F600", "a" * 5_000, "null", "[]", "{}",
]
HOSTILE = st.sampled_from(HOSTILE_VALUES) | st.text(max_size=40) | st.integers(min_value=-(10 ** 30), max_value=10 ** 30).map(str)


def valid_value(schema: dict) -> st.SearchStrategy[str]:
    """Text the documented schema allows, as a query string carries it (lists comma-separated)."""
    if "enum" in schema:
        return st.sampled_from([str(v) for v in schema["enum"]])
    kind = schema.get("type")
    if kind == "integer":
        return st.integers(schema.get("minimum", -1000), schema.get("maximum", 1000)).map(str)
    if kind == "number":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        return st.floats(lo, schema.get("maximum", 1e6), allow_nan=False).filter(lambda x: x > 0).map(repr)
    if kind == "boolean":
        return st.sampled_from(config.TRUE_WORDS + config.FALSE_WORDS)
    if kind == "array":
        return st.lists(valid_value(schema["items"]), min_size=1, max_size=3).map(",".join)
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    return st.text(max_size=20)


def value_for(schema: dict) -> st.SearchStrategy[str]:
    return st.one_of(valid_value(schema), valid_value(schema), HOSTILE)


NAMES = st.sampled_from(["", "STEPS", "steps[]", "with-stack", "\u0455teps", "x" * 300]) | st.text(max_size=12)


@st.composite
def query_pairs(draw, op: dict) -> list[tuple[str, str]]:
    documented = {p["name"]: p["schema"] for p in op.get("parameters", []) if p["in"] == "query"}
    if documented and draw(st.booleans()):  # valid values of names that combine freely: starts succeed
        return [(name, draw(valid_value(schema))) for name, schema in documented.items()
                if name == "steps" or name in COMBINE_FREELY and draw(st.booleans())]
    pairs = []
    for name, schema in documented.items():
        if draw(st.booleans()) or name == "steps" and draw(st.integers(0, 3)):
            pairs.append((name, draw(value_for(schema))))
    if documented and draw(st.integers(0, 4)) == 0:  # a repeated parameter
        name = draw(st.sampled_from(sorted(documented)))
        pairs.append((name, draw(value_for(documented[name]))))
    if draw(st.integers(0, 4)) == 0 or not documented and draw(st.booleans()):  # an unknown one
        pairs.append((draw(NAMES), draw(HOSTILE)))
    return draw(st.permutations(pairs))


RAW_QUERY = st.sampled_from(["%ff", "steps=%ff", "steps=%", "steps=%zz", "&&", "=", "steps", "steps==1", "a=1;b=2",
                             "steps=1&steps=2", "%00=1", "steps=%C0%AF", "+=+"])


@st.composite
def query_string(draw, op: dict) -> str:
    text = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in draw(query_pairs(op)))
    if draw(st.integers(0, 5)) == 0:  # something no encoder would write
        text = "&".join(filter(None, [text, draw(RAW_QUERY)]))
    return text


EXISTING = "<an id of a job started earlier>"


def path_value(schema: dict) -> st.SearchStrategy[str]:
    options = [st.just(EXISTING), st.text(min_size=1, max_size=30),
               st.sampled_from(["..", ".", "%2e%2e", "trace.json.gz", "capture.json", "summary.json", "a" * 3000,
                                "\u0665", "20261121-044636-549db8", "s20261121-051500-0a1b2c"])]
    if "pattern" in schema:
        options.append(st.from_regex(schema["pattern"], fullmatch=True))
    return st.one_of(options)


JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=5)
HEADER_TOKEN = st.text(st.characters(min_codepoint=33, max_codepoint=126, exclude_characters=';,"'), min_size=1,
                       max_size=20)
CONTENT_TYPES = st.sampled_from(["application/json", "application/x-www-form-urlencoded", "multipart/form-data",
                                 "multipart/form-data; boundary=xyz", "text/plain", "application/x-protobuf",
                                 "application/octet-stream", "application/JSON", ""]) | HEADER_TOKEN
CHARSETS = st.sampled_from([None, "utf-8", "latin-1", "utf-16", "ascii", "no-such-charset", "rot13", "base64",
                            "utf-8-sig", "idna", "punycode", "unicode-escape"]) | HEADER_TOKEN
ENCODINGS = st.sampled_from([None, None, "gzip", "deflate", "br", "identity", "compress", "x-unknown", "GZIP"])


@st.composite
def body_and_headers(draw, op: dict) -> tuple[bytes | None, dict[str, str]]:
    documented = {p["name"]: p["schema"] for p in op.get("parameters", []) if p["in"] == "query"}
    kind = draw(st.sampled_from(["none", "json", "form", "bytes"]))
    headers: dict[str, str] = {}
    if kind == "none":
        return None, headers
    if kind == "json":
        names = draw(st.lists(st.sampled_from(sorted(documented)) if documented else NAMES, max_size=4)) \
            + draw(st.lists(NAMES, max_size=1))
        obj = {n: draw(st.one_of(value_for(documented[n]) if n in documented else HOSTILE, JSON_VALUE))
               for n in names}
        body = json.dumps(obj).encode() if draw(st.integers(0, 5)) else draw(st.binary(max_size=50))
        content_type = "application/json"
    elif kind == "form":
        pairs = draw(query_pairs(op))
        body = "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs).encode()
        content_type = "application/x-www-form-urlencoded"
    else:
        body = draw(st.binary(max_size=200))
        content_type = draw(CONTENT_TYPES)
    if draw(st.integers(0, 3)) == 0:
        content_type = draw(CONTENT_TYPES)
    charset = draw(CHARSETS) if draw(st.integers(0, 3)) == 0 else None
    if content_type or charset:
        headers["Content-Type"] = content_type + (f"; charset={charset}" if charset else "")
    encoding = draw(ENCODINGS) if draw(st.integers(0, 2)) == 0 else None
    if encoding:
        headers["Content-Encoding"] = encoding
        if encoding.lower() == "gzip" and draw(st.booleans()):
            body = gzip.compress(body)
        elif encoding == "deflate" and draw(st.booleans()):
            body = zlib.compress(body)
    return body, headers


@st.composite
def requests(draw, method: str, path: str, op: dict):
    for param in op.get("parameters", []):
        if param["in"] == "path":
            path = path.replace("{%s}" % param["name"], "\0" + param["name"] + "\0")
    path_values = {p["name"]: draw(path_value(p["schema"])) for p in op.get("parameters", []) if p["in"] == "path"}
    query = draw(query_string(op))
    body, headers = draw(body_and_headers(op)) if method == "POST" or draw(st.integers(0, 9)) == 0 else (None, {})
    return path, path_values, query, body, headers


# -- the property ------------------------------------------------------------------------------------------

def check_answer(what: str, status: int, content_type: str, raw: bytes) -> None:
    assert status < 500, f"{what}: {status} {raw[:500]!r}"
    if status >= 400:
        assert content_type == "application/json", f"{what}: {status} {content_type} {raw[:500]!r}"
        body = json.loads(raw)
        assert isinstance(body, dict), f"{what}: {body!r}"
        assert isinstance(body.get("error"), str) and body["error"], f"{what}: {body!r}"
        assert isinstance(body.get("message"), str) and body["message"], f"{what}: {body!r}"


def fill(path: str, values: dict[str, str], known_ids: list[str]) -> str:
    for name, value in values.items():
        if value == EXISTING:
            value = known_ids[-1] if known_ids else "20261121-044636-549db8"
        path = path.replace("\0" + name + "\0", quote(value, safe=""))
    return path


# Examples per operation: the start routes have the most to explore.
EXAMPLES = {"/profile/start": 250, "/sync/start": 200, "/modules/start": 200}
DEFAULT_EXAMPLES = 40


@pytest.mark.parametrize("method, path, op", OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS])
def test_no_operation_answers_5xx_or_a_non_json_error(sidecar, method, path, op):
    @settings(max_examples=EXAMPLES.get(path, DEFAULT_EXAMPLES), deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(requests(method, path, op))
    def fuzz(request):
        template, path_values, query, body, headers = request
        url = fill(template, path_values, sidecar.ids) + (f"?{query}" if query else "")
        status, content_type, raw = sidecar.request(method, url, body, headers)
        what = f"{method} {url[:300]} body={body[:100] if body else body!r} headers={headers}"
        check_answer(what, status, content_type, raw)
        if status == 202:
            sidecar.started += 1
            sidecar.ids.append(json.loads(raw)["id"])
            sidecar.stop_jobs()

    fuzz()
    # Healthy afterwards: the health check, and a plain start and stop still work.
    status, _, raw = sidecar.request("GET", "/healthz", None, {})
    assert status == 200 and json.loads(raw)["status"] == "ok", raw
    if path in START_PATHS:
        assert sidecar.started, f"no example of {method} {path} started a job: the fuzz explores too little"
        status, _, raw = sidecar.request("POST", path, b'{"steps": 2}', {"Content-Type": "application/json"})
        assert status == 202, raw
        sidecar.stop_jobs()


START_OPERATIONS = [(m, p, op) for m, p, op in OPERATIONS if p in START_PATHS]


@pytest.mark.parametrize("method, path, op", START_OPERATIONS, ids=[f"{m} {p}" for m, p, _ in START_OPERATIONS])
def test_every_hostile_value_in_every_start_parameter(sidecar, method, path, op):
    """The sweep the random fuzz may miss: each listed hostile value in each documented parameter, the
    others valid (steps=1), in the query string and, on POST, in a JSON body."""
    names = [p["name"] for p in op["parameters"] if p["in"] == "query"]
    for name in names:
        for value in HOSTILE_VALUES:
            query = {"steps": "1", name: value}
            url = f"{path}?" + "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
            status, content_type, raw = sidecar.request(method, url, None, {})
            check_answer(f"{method} {url[:300]}", status, content_type, raw)
            if method == "POST":
                body = json.dumps(query).encode()
                answer = sidecar.request(method, path, body, {"Content-Type": "application/json"})
                check_answer(f"{method} {path} {body[:300]!r}", *answer)
                status = max(status, answer[0]) if answer[0] == 202 else status
            if status == 202:
                sidecar.stop_jobs()
    assert sidecar.request("GET", "/healthz", None, {})[0] == 200
