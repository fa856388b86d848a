"""Retention by size (issue #10): the newest finished captures are kept while their folders total at
most ``--keep-mb``; older ones are deleted from disk, in this run and after a restart. The newest
always stays, whatever its size."""

from dataclasses import replace

from sidecar.service.app import make_app
from sidecar.service.export.disk_space import tree_bytes
from sidecar.service.routes.keys import REGISTRY

from test_restart_index import one_capture, settings


def folders(trace_dir):
    return sorted(p.name for p in (trace_dir / "captures").iterdir())


async def captures(aiohttp_client, app, trace_dir, count):
    client = await aiohttp_client(app)
    ids = []
    for _ in range(count):
        body = await one_capture(client, app, trace_dir)
        assert body["state"] == "done", body
        for conn in app[REGISTRY].all():  # one_capture connects a fake worker of its own each time
            app[REGISTRY].remove(conn)
        ids.append(body["id"])
    return client, ids


async def test_the_oldest_captures_go_once_the_bytes_bound_is_passed(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    probe_app = make_app(settings(tmp_path))
    client, (first,) = await captures(aiohttp_client, probe_app, trace_dir, 1)
    one = tree_bytes(trace_dir / "captures" / first)
    assert one > 0
    await client.close()

    # Room for two and a half captures of that size: after four more, the newest two stay.
    app = make_app(replace(settings(tmp_path), keep_bytes=int(2.5 * one)))
    client, ids = await captures(aiohttp_client, app, trace_dir, 4)
    assert folders(trace_dir) == sorted(ids[-2:])
    listed = [c["id"] for c in (await (await client.get("/profiles")).json())["captures"]]
    assert listed == list(reversed(ids[-2:]))
    assert (await client.get(f"/profile/{ids[0]}")).status == 404


async def test_the_newest_capture_stays_whatever_its_size(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    app = make_app(replace(settings(tmp_path), keep_bytes=1))
    client, ids = await captures(aiohttp_client, app, trace_dir, 2)
    assert folders(trace_dir) == [ids[-1]]
    body = await (await client.get(f"/profile/{ids[-1]}")).json()
    assert body["state"] == "done" and body["trace"]


async def test_a_restart_applies_the_bytes_bound_to_what_is_on_disk(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    client, ids = await captures(aiohttp_client, make_app(settings(tmp_path)), trace_dir, 3)
    one = max(tree_bytes(trace_dir / "captures" / i) for i in ids)
    await client.close()
    assert len(folders(trace_dir)) == 3

    make_app(replace(settings(tmp_path), keep_bytes=int(1.5 * one)))
    assert folders(trace_dir) == [ids[-1]]


async def test_the_count_bound_still_holds_under_a_generous_bytes_bound(aiohttp_client, tmp_path):
    trace_dir = tmp_path / "traces"
    _client, ids = await captures(aiohttp_client, make_app(replace(settings(tmp_path, keep=2), keep_bytes=1 << 40)),
                                  trace_dir, 3)
    assert folders(trace_dir) == sorted(ids[-2:])
