"""Every error the HTTP API gives is JSON of the documented shape, {"error", "message"} (docs/api.md),
at every layer: bodies that cannot be read, exceptions raised in a view, and what aiohttp's own HTTP
parser refuses before any view or middleware runs (that one needs the sidecar's runner on a real
socket, so those tests send raw bytes)."""

import asyncio
import gzip
import json
import logging
import re

import pytest
from aiohttp import web

from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.serving import JsonErrorsRunner

JSON = {"Content-Type": "application/json"}
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def settings(tmp_path, **overrides):
    base = dict(trace_dir=tmp_path / "traces", probe_token="probe-token-for-these-tests", http_token=None,
                max_steps=50, max_capture_bytes=1 << 30, keep=5, stop_grace_s=1.0)
    return ServiceSettings(**{**base, **overrides})


async def boom(request):
    raise RuntimeError("secret detail of the failure")


async def conflict(request):
    raise web.HTTPConflict(text="that thing is busy", headers={"Retry-After": "3"})


async def already_json(request):
    raise web.HTTPConflict(text=json.dumps({"error": "teapot", "message": "short and stout", "extra": 1}),
                         content_type="application/json")


@pytest.fixture
async def client(aiohttp_client, tmp_path):
    app = make_app(settings(tmp_path))
    app.router.add_get("/test/boom", boom)
    app.router.add_get("/test/conflict", conflict)
    app.router.add_get("/test/teapot", already_json)
    return await aiohttp_client(app)


async def json_error(resp, status):
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json", await resp.text()
    body = await resp.json()
    assert isinstance(body["error"], str) and body["error"], body
    assert isinstance(body["message"], str) and body["message"], body
    return body


# -- bodies ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, headers, what", [
    (b"\xff", JSON, "UTF-8"),  # the curl: --data-binary $'\xff'
    (b'{"steps": "\xe9"}', JSON, "UTF-8"),
    (b"[" * 100_000, JSON, "deep"),
    (b"[" * 100_000 + b"]" * 100_000, JSON, "deep"),
    (b'{"steps": 1}', {"Content-Type": "application/json; charset=no-such-charset"}, "no-such-charset"),
    (b'{"steps": 1}', {"Content-Type": "application/json; charset=rot13"}, "rot13"),  # not a bytes codec
    (b'{"steps": 1}', {**JSON, "Content-Encoding": "gzip"}, "gzip"),
    (b"1" * 5000, JSON, "JSON"),  # an integer over int()'s digit limit: a ValueError, not a JSONDecodeError
    (b"[1]", JSON, "object"),
])
async def test_a_body_that_cannot_be_read_is_a_json_400_naming_the_body(client, data, headers, what):
    body = await json_error(await client.post("/profile/start", data=data, headers=headers), 400)
    assert body["error"] == "bad_parameter" and body["param"] == "body", body
    assert what.lower() in body["message"].lower(), body


@pytest.mark.parametrize("value", [{"a": 1}, [5], None])
async def test_a_json_value_that_is_no_scalar_names_its_parameter(client, value):
    resp = await client.post("/profile/start", data=json.dumps({"steps": value}), headers=JSON)
    body = await json_error(resp, 400)
    assert body["param"] == "steps" and "string, number or boolean" in body["message"], body


@pytest.mark.parametrize("data, headers", [
    (b"steps=1", FORM),
    (b"steps=1", {"Content-Type": "application/x-www-form-urlencoded; charset=latin-1"}),
    (b"", FORM),  # a form with no fields: the parameters in the action URL's query string
    (b'--xyz\r\nContent-Disposition: form-data; name="steps"\r\n\r\n5\r\n--xyz--\r\n',
     {"Content-Type": "multipart/form-data; boundary=xyz"}),
    (b'{"steps": 1}', {"Content-Type": "text/plain"}),  # a no-cors fetch's body: JSON in a simple type
])
async def test_a_body_any_web_page_could_send_is_refused_before_it_is_read(client, data, headers):
    # A form, multipart or text/plain body is what a page on another site can make the browser send with
    # no CORS preflight (browser_guard.py): refused whatever it holds, the query string and JSON still work.
    body = await json_error(await client.post("/profile/start?steps=1", data=data, headers=headers), 403)
    assert body["error"] == "cross_site_request" and "application/json" in body["message"], body


async def test_a_body_of_another_media_type_is_refused_not_ignored(client):
    resp = await client.post("/profile/start", data=b"steps=1", headers={"Content-Type": "application/xml"})
    body = await json_error(resp, 415)
    assert body["error"] == "unsupported_media_type" and "application/json" in body["message"], body


async def test_a_body_over_the_size_limit_is_a_json_413(client):
    resp = await client.post("/profile/start", data=b'{"steps": 1, "x": "' + b"a" * (2 << 20) + b'"}', headers=JSON)
    assert (await json_error(resp, 413))["error"] == "too_large"


@pytest.mark.parametrize("data, headers", [
    (b'{"steps": 1, "record_shapes": true, "timeout_s": 2.5}', JSON),
    (b'{"steps": 1}\n', JSON),
    (gzip.compress(b'{"steps": 1}'), {**JSON, "Content-Encoding": "gzip"}),
    (json.dumps({"steps": "1"}).encode("utf-16"), {"Content-Type": "application/json; charset=utf-16"}),
    (b'{"steps": 1, "processes": "worker"}', {"Content-Type": "application/json; charset=latin-1"}),
])
async def test_good_bodies_are_read(client, data, headers):
    # No engine is connected: a request whose parameters were all read and valid gets this far.
    body = await json_error(await client.post("/profile/start", data=data, headers=headers), 503)
    assert body["error"] == "no_engine_processes"


# -- exceptions in views -----------------------------------------------------------------------------------

async def test_an_http_exception_with_a_text_body_becomes_json_keeping_status_message_and_headers(client):
    resp = await client.get("/test/conflict")
    body = await json_error(resp, 409)
    assert body == {"error": "conflict", "message": "that thing is busy"}
    assert resp.headers["Retry-After"] == "3"


async def test_a_method_not_allowed_keeps_its_allow_header(client):
    resp = await client.put("/profile/start", params={"steps": "1"})
    body = await json_error(resp, 405)
    assert body["error"] == "method_not_allowed"
    assert set(resp.headers["Allow"].split(",")) == {"GET", "POST"}


# Fixed words that a dynamic route of the same prefix could take for an id (/profile/{id} and /profile/stop).
@pytest.mark.parametrize("method, path, allowed", [
    ("GET", "/profile/stop", {"POST"}),
    ("HEAD", "/profile/stop", {"POST"}),
    ("DELETE", "/profile/stop", {"POST"}),
    ("GET", "/sync/stop", {"POST"}),
    ("HEAD", "/sync/stop", {"POST"}),
    ("PUT", "/sync/stop", {"POST"}),
    ("PUT", "/profile/start", {"GET", "POST"}),
    ("DELETE", "/sync/start", {"GET", "POST"}),
])
async def test_a_wrong_method_on_a_reserved_path_is_a_405_not_an_unknown_id(client, method, path, allowed):
    resp = await client.request(method, path)
    assert resp.status == 405, await resp.text()
    assert set(resp.headers["Allow"].split(",")) == allowed
    if method != "HEAD":
        body = await json_error(resp, 405)
        assert body["error"] == "method_not_allowed"
        assert method in body["message"] and all(m in body["message"] for m in allowed), body


def _route_table(app) -> dict[str, set[str]]:
    """canonical path -> the methods its routes serve ("*": what start_params takes)."""
    table: dict[str, set[str]] = {}
    for route in app.router.routes():
        methods = {"GET", "POST"} if route.method == "*" else {route.method}
        table.setdefault(route.resource.canonical, set()).update(methods)
    return table


async def test_every_path_answers_every_other_method_with_a_json_405_listing_its_own(client):
    wrong = []
    for canonical, methods in sorted(_route_table(client.app).items()):
        path = re.sub(r"\{(\w+)\}", r"no-such-\1", canonical)
        for method in sorted({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"} - methods):
            resp = await client.request(method, path)
            allow = set(filter(None, resp.headers.get("Allow", "").split(",")))
            json_body = method == "HEAD" or resp.content_type == "application/json"
            if resp.status != 405 or allow != methods or not json_body:
                wrong.append(f"{method} {path}: {resp.status} Allow={sorted(allow)} ({resp.content_type}), "
                             f"expected 405 Allow={sorted(methods)}")
    assert not wrong, "\n".join(wrong)


async def test_a_reserved_word_under_a_job_path_is_no_capture_and_no_405(client):
    for path in ("/profile/stop/trace", "/profile/start/summary", "/sync/stop/x", "/profile/stopped"):
        await json_error(await client.get(path), 404)


async def test_an_http_exception_that_is_already_json_is_left_as_it_is(client):
    resp = await client.get("/test/teapot")
    assert resp.status == 409 and await resp.json() == {"error": "teapot", "message": "short and stout", "extra": 1}


async def test_not_found_of_the_router_and_of_a_view_are_json(client):
    await json_error(await client.get("/nope"), 404)
    body = await json_error(await client.get("/profile/20990101-000000-abcdef"), 404)
    assert "no capture" in body["message"]
    body = await json_error(await client.get("/sync/s20990101-000000-abcdef"), 404)
    assert "no sync scan" in body["message"]


async def test_an_unexpected_exception_is_a_logged_json_500_that_tells_nothing_inside(client, caplog):
    with caplog.at_level(logging.ERROR):
        body = await json_error(await client.get("/test/boom"), 500)
    assert body["error"] == "internal_server_error"
    assert "secret detail" not in json.dumps(body)
    [record] = [r for r in caplog.records if r.exc_info and "secret detail" in str(r.exc_info[1])]
    assert "/test/boom" in record.getMessage()


async def test_a_lower_case_bearer_scheme_is_accepted(aiohttp_client, tmp_path):
    client = await aiohttp_client(make_app(settings(tmp_path, http_token="an-http-token-0123456789")))
    body = await json_error(await client.get("/processes"), 401)
    assert body["error"] == "unauthorized"
    for scheme in ("Bearer", "bearer", "BEARER"):
        resp = await client.get("/processes", headers={"Authorization": f"{scheme} an-http-token-0123456789"})
        assert resp.status == 200, scheme
    resp = await client.get("/processes", headers={"Authorization": "Basic an-http-token-0123456789"})
    await json_error(resp, 401)


# -- aiohttp's HTTP parser, before any middleware: the sidecar's runner on a real socket --------------------

@pytest.fixture
async def port(tmp_path):
    runner = JsonErrorsRunner(make_app(settings(tmp_path)), shutdown_timeout=1.0)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield runner.addresses[0][1]
    await runner.cleanup()


async def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send raw bytes, read until the server closes, split the one response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.parametrize("raw", [
    b"FOO /profile/start HTTP/1.1\r\nHost: localhost\r\n\r\n",  # a method the parser does not know
    b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",  # a request line over 8190 bytes
    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Long: " + b"b" * 9000 + b"\r\n\r\n",  # a header over 8190 bytes
    b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nBad Header: 1\r\n\r\n",  # a space in a header name
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # TLS to a plain HTTP port
    b"GET /healthz HTTP/9.9\r\nHost: localhost\r\n\r\n",
])
async def test_what_the_http_parser_refuses_is_a_json_400(port, raw):
    status, headers, body = await exchange(port, raw)
    assert status == 400
    assert headers["content-type"].startswith("application/json"), (headers, body)
    error = json.loads(body)
    assert error["error"] == "bad_request" and error["message"], error


async def test_a_body_that_is_not_deflate_as_it_claims_is_a_json_400(port):
    # aiohttp's parser finds this one at the body's end, so its own error path answers, not the view.
    raw = (b"POST /profile/start HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
           b"Content-Encoding: deflate\r\nContent-Length: 12\r\n\r\n{\"steps\": 1}")
    status, headers, body = await exchange(port, raw)
    assert status == 400 and headers["content-type"].startswith("application/json"), (headers, body)
    assert "deflate" in json.loads(body)["message"]


async def test_a_chunked_body_that_breaks_off_is_a_json_400(port):
    raw = (b"POST /profile/start HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n"
           b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
    status, headers, body = await exchange(port, raw)
    assert status == 400 and headers["content-type"].startswith("application/json"), (headers, body)
    assert json.loads(body)["message"]


async def test_good_requests_still_pass_the_runner(port):
    status, headers, body = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert status == 200 and json.loads(body)["status"] == "ok"
    raw = (b"POST /profile/start HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Type: application/json\r\n"
           b"Content-Length: 1\r\n\r\n\xff")
    status, headers, body = await exchange(port, raw)
    assert status == 400 and json.loads(body)["param"] == "body"
