"""Issue 10, defect 4: the pushes OTLP/HTTP allows are taken. A gzip body is decoded once (aiohttp's
HTTP parser does it), a corrupt one is a 400, a body up to the documented 16 MiB is read whatever the
app's ``client_max_size``, a larger one (or a gzip bomb) is a 413 without being held in memory: every
refusal is the project's JSON error."""

import gzip
import tracemalloc

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from sidecar.service.app import ServiceSettings, make_app
from sidecar.service.routes.metrics import MAX_BODY_BYTES

from .metric_pushes import PUSH, TOKEN, app, gauge, request, samples, signed


def _big_request(nbytes: int):
    """A valid push of about ``nbytes``: many points, each with a long label value."""
    value = "x" * 1000
    metric = gauge("big.gauge")
    template = metric.gauge.data_points[0]
    del metric.gauge.data_points[:]
    for i in range(nbytes // 1024 + 1):
        point = metric.gauge.data_points.add()
        point.CopyFrom(template)
        point.as_double = float(i)
        point.attributes.add(key="i", value=AnyValue(string_value=f"{i}-{value}"))
    return request(1, metric)


async def _json_error(resp, status: int, error: str) -> dict:
    assert resp.status == status, await resp.text()
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert set(body) == {"error", "message"} and body["error"] == error, body
    return body


async def test_a_gzip_push_is_decoded_once(aiohttp_client):
    client = await aiohttp_client(app())
    body = request(1, gauge("zipped.gauge", 5.0)).SerializeToString()
    resp = await client.post(PUSH, data=gzip.compress(body), headers=signed(body, **{"Content-Encoding": "gzip"}))
    assert resp.status == 200, await resp.text()
    assert samples(await (await client.get("/metrics")).text())["zipped_gauge"][0][1] == 5.0


async def test_corrupt_gzip_is_a_400_naming_the_encoding(aiohttp_client):
    client = await aiohttp_client(app())
    body = b"\x1f\x8b\x08\x00" + b"not deflate at all" * 10
    resp = await client.post(PUSH, data=body, headers=signed(body, **{"Content-Encoding": "gzip"}))
    error = await _json_error(resp, 400, "bad_request")
    assert "gzip" in error["message"]


async def test_an_unknown_content_encoding_is_a_415(aiohttp_client):
    client = await aiohttp_client(app())
    body = request(1, gauge("g")).SerializeToString()
    resp = await client.post(PUSH, data=body, headers=signed(body, **{"Content-Encoding": "snappy"}))
    error = await _json_error(resp, 415, "unsupported_media_type")
    assert "snappy" in error["message"]


@pytest.mark.parametrize("zipped", [False, True])
async def test_bodies_over_aiohttps_default_limit_are_read(aiohttp_client, zipped):
    client = await aiohttp_client(app())
    body = _big_request(3 << 20).SerializeToString()
    assert 3 << 20 < len(body) < MAX_BODY_BYTES
    headers = signed(body, **({"Content-Encoding": "gzip"} if zipped else {}))
    resp = await client.post(PUSH, data=gzip.compress(body) if zipped else body, headers=headers)
    assert resp.status == 200, await resp.text()
    assert len(samples(await (await client.get("/metrics")).text())["big_gauge"]) > 3000


async def test_the_sidecar_app_takes_a_large_gzip_push(aiohttp_client, tmp_path):
    """The same through the app ``sidecar serve`` runs (its middleware, its client_max_size)."""
    settings = ServiceSettings(trace_dir=tmp_path, probe_token=TOKEN, http_token=None, max_steps=10,
                               max_capture_bytes=1 << 20, keep=2)
    client = await aiohttp_client(make_app(settings))
    body = _big_request(2 << 20).SerializeToString()
    resp = await client.post(PUSH, data=gzip.compress(body), headers=signed(body, **{"Content-Encoding": "gzip"}))
    assert resp.status == 200, await resp.text()
    over = b"\0" * (MAX_BODY_BYTES + 1)
    await _json_error(await client.post(PUSH, data=over, headers=signed(over)), 413, "too_large")


async def test_over_the_limit_is_a_413_however_it_comes(aiohttp_client):
    client = await aiohttp_client(app())
    over = b"\0" * (MAX_BODY_BYTES + 1)
    await _json_error(await client.post(PUSH, data=over, headers=signed(over)), 413, "too_large")

    async def chunks():  # no Content-Length: only reading tells
        for _ in range(17):
            yield b"\0" * (1 << 20)

    digest_of = b"\0" * (17 << 20)
    await _json_error(await client.post(PUSH, data=chunks(), headers=signed(digest_of)), 413, "too_large")


async def test_a_gzip_bomb_is_refused_without_inflating_it(aiohttp_client):
    client = await aiohttp_client(app())
    inflated = b"\0" * (64 << 20)
    bomb = gzip.compress(inflated)
    headers = signed(inflated, **{"Content-Encoding": "gzip"})
    assert len(bomb) < 1 << 20  # well under the limit as sent
    del inflated
    tracemalloc.start()
    try:
        resp = await client.post(PUSH, data=bomb, headers=headers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    await _json_error(resp, 413, "too_large")
    assert peak < 3 * MAX_BODY_BYTES, peak  # read up to the limit, never the 64 MiB
