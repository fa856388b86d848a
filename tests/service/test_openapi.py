"""``GET /openapi.json`` (issue #10): a valid OpenAPI 3.1 document of the whole HTTP API, in step with the
app's routes, with docs/api.md's endpoint headings and with the start parameters params.py parses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from sidecar.service.jobs import params
from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.jobs.model import CAPTURE, SCAN
from sidecar.service.openapi import build_document, id_pattern, route_operations

API_MD = Path(__file__).resolve().parents[2] / "docs" / "api.md"
TOKEN = "a-token-for-these-tests-0123"
# "### `GET /path`", "### `GET|POST /path`", several in one heading separated by commas.
ENDPOINT = re.compile(r"`((?:[A-Z]+\|)*[A-Z]+) (/[^`\s]*)`")


def settings(tmp_path, **overrides):
    base = dict(trace_dir=tmp_path / "traces", probe_token="probe-token-for-these-tests", http_token=None,
                max_steps=50, max_capture_bytes=1 << 30, keep=5, stop_grace_s=1.0)
    return ServiceSettings(**{**base, **overrides})


@pytest.fixture
def app(tmp_path):
    return make_app(settings(tmp_path))


@pytest.fixture
def document(app):
    return build_document(app)


def document_operations(document) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items() for method in item}


def heading_operations() -> set[tuple[str, str]]:
    ops = set()
    for line in API_MD.read_text().splitlines():
        if re.match(r"#{2,4} ", line):
            for methods, path in ENDPOINT.findall(line):
                ops.update((m, path) for m in methods.split("|"))
    return ops


def test_the_document_is_valid_openapi_3_1(document):
    from openapi_spec_validator import validate

    assert document["openapi"].startswith("3.1")
    validate(document)


def test_every_route_is_in_the_document_and_every_operation_is_a_route(app, document):
    routes = route_operations(app)
    assert routes, "the app has routes"
    assert ("HEAD", "/healthz") not in routes, "HEAD duplicates of GET routes are left out"
    assert routes == document_operations(document)
    # The same, read from the router directly rather than through the helper the document uses.
    raw = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    expanded = {(m, p) for method, p in raw for m in (("GET", "POST") if method == "*" else (method,))}
    assert expanded == document_operations(document)


def test_every_documented_path_is_a_heading_of_api_md_and_every_heading_is_documented(document):
    headings = heading_operations()
    assert headings, "docs/api.md has endpoint headings"
    missing_in_md = document_operations(document) - headings
    missing_in_document = headings - document_operations(document)
    assert not missing_in_md, f"operations with no '### `METHOD /path`' heading in docs/api.md: {missing_in_md}"
    assert not missing_in_document, f"docs/api.md headings not in /openapi.json: {missing_in_document}"


def _query(document, path, method):
    return {p["name"]: p for p in document["paths"][path][method].get("parameters", []) if p["in"] == "query"}


def test_start_parameters_are_the_parsers_own(document):
    for method in ("get", "post"):
        assert set(_query(document, "/profile/start", method)) == params.KNOWN
        assert set(_query(document, "/sync/start", method)) == params.SCAN_KNOWN
    capture = _query(document, "/profile/start", "get")
    assert capture["stacks"]["schema"]["enum"] == list(params.STACK_MODES)
    assert capture["activities"]["schema"]["items"]["enum"] == list(params.ACTIVITIES)
    assert capture["steps"]["required"] and capture["steps"]["schema"]["maximum"] == 50  # the app's --max-steps
    body = document["paths"]["/profile/start"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(body["properties"]) == params.KNOWN
    assert "requestBody" not in document["paths"]["/profile/start"]["get"]


@hsettings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.from_regex(id_pattern(CAPTURE), fullmatch=True), st.from_regex(id_pattern(SCAN), fullmatch=True))
def test_the_id_patterns_are_what_the_job_kinds_accept(capture_id, scan_id):
    # derandomize: the same examples on every run (CI reproducible); database=None: nothing written.
    assert CAPTURE.is_id(capture_id) and SCAN.is_id(scan_id)
    assert not CAPTURE.is_id(scan_id) and not SCAN.is_id(capture_id)


def test_the_process_pattern_matches_the_parser(document):
    pattern = _query(document, "/sync/start", "get")["processes"]["schema"]["items"]["pattern"]
    for role in params.known_roles():
        assert re.match(pattern, role) and re.match(pattern, f"{role}:3")
        assert params._processes(f"{role}:3", params.known_roles())
    assert not re.match(pattern, "worker:")


def test_the_websocket_and_the_signed_push_are_marked(document):
    ws = document["paths"]["/probe/ws"]["get"]
    assert ws["x-websocket"] is True and "101" in ws["responses"] and ws["security"] == []
    assert document["paths"]["/v1/metrics"]["post"]["security"] == []
    assert document["paths"]["/healthz"]["get"]["security"] == []
    assert "security" not in document["paths"]["/openapi.json"]["get"]  # the global bearer applies


async def test_openapi_json_is_served_behind_the_token(aiohttp_client, tmp_path):
    client = await aiohttp_client(make_app(settings(tmp_path, http_token=TOKEN)))
    denied = await client.get("/openapi.json")
    assert denied.status == 401
    assert (await denied.json())["error"] == "unauthorized"
    assert (await client.get("/healthz")).status == 200
    resp = await client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
    assert resp.status == 200 and resp.content_type == "application/json"
    served = await resp.json()
    assert served["openapi"] == "3.1.0" and "/openapi.json" in served["paths"]
