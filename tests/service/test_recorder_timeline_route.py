"""``GET /recorder/timeline`` against real probes in stand-in engines (tests/fake_engine.py): its points
are the steps ``/recorder`` lists, a planted slow step is kept with its row, refreshes ask the probes
only for what is new (``Query.since_ns``), tabs share one read, and bad parameters are a 400 naming them."""

import asyncio

from sidecar.service.incidents.recorder_timeline import SLOW_TOP
from sidecar.service.routes.timeline import TIMELINE

from test_service import engines, sidecar, wait_processes  # noqa: F401 (fixtures)


async def _json(client, path, **params):
    resp = await client.get(path, params=params)
    assert resp.status == 200, await resp.text()
    return await resp.json()


async def test_the_timeline_counts_the_steps_the_recorder_holds_and_keeps_the_slow_one(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--steps-then-idle", "30", "--slow-step-at", "20",
            "--slow-step-ms", "300")
    await wait_processes(client, 1)
    for _ in range(100):  # 30 steps of 2 ms, the 20th of 300 ms, then idle
        recorder = await _json(client, "/recorder", seconds="60")
        if sum(s["working"] for s in recorder["processes"][0]["steps"]) >= 30:
            break
        await asyncio.sleep(0.1)
    steps = recorder["processes"][0]["steps"]
    body = await _json(client, "/recorder/timeline", seconds="60", points="50")
    (view,) = body["processes"]
    assert body["points"] == 50 and body["until_ns"] - body["since_ns"] == 60 * 10**9
    assert body["bucket_ns"] == 60 * 10**9 // 50
    assert view["steps"] == len(steps) and sum(b["steps"] for b in view["buckets"]) == len(steps)
    assert sum(b["working"] for b in view["buckets"]) == sum(s["working"] for s in steps)
    # Every step is in the bucket of its start, and the bucket's max is its longest.
    for b in view["buckets"]:
        mine = [s for s in steps if b["start_ns"] <= max(s["start_ns"], body["since_ns"]) < b["start_ns"] + body["bucket_ns"]]
        assert len(mine) == b["steps"]
        assert b["max_ms"] == max(s["duration_ms"] for s in mine)
    slowest = max(steps, key=lambda s: s["duration_ms"])
    assert slowest["duration_ms"] >= 300
    first = view["slow_steps"][0]
    assert first["over"] and first["step"] == slowest["step"] and first["duration_ms"] == slowest["duration_ms"]
    assert first["batch"] == slowest["batch"] and first["tokens"] == slowest["tokens"] and "gc_ms" in first
    assert len(view["slow_steps"]) == min(SLOW_TOP, len(steps))
    durations = [s["duration_ms"] for s in view["slow_steps"]]
    assert durations == sorted(durations, reverse=True)
    # The caller's threshold: only the planted step is over it (the host's stalls are not 250 ms).
    body = await _json(client, "/recorder/timeline", seconds="60", points="50", slow_ms="250")
    (view,) = body["processes"]
    over = [s for s in view["slow_steps"] if s["over"]]
    assert view["slow_ms"] == 250 and [s["step"] for s in over if s["working"]] == [slowest["step"]], over


async def test_refreshes_ask_only_for_new_rows_and_tabs_share_one_read(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--step-ms", "5")
    await wait_processes(client, 1)
    store = client.app[TIMELINE]
    await _json(client, "/recorder/timeline", seconds="60")
    assert store.whole_reads == 1
    # Five tabs at once: one refresh (or none, within the freshness of the first).
    await asyncio.sleep(1.1)
    before = store.refreshes
    bodies = await asyncio.gather(*(_json(client, "/recorder/timeline", seconds="60") for _ in range(5)))
    assert store.refreshes - before == 1
    assert len({b["read_ns"] for b in bodies}) == 1
    # Later refreshes are incremental: the held steps grow, none is counted twice.
    for _ in range(3):
        await asyncio.sleep(1.1)
        body = await _json(client, "/recorder/timeline", seconds="60")
    assert store.whole_reads == 1 and store.refreshes >= 4
    recorder = await _json(client, "/recorder", seconds="60")
    steps = recorder["processes"][0]["steps"]
    held = body["processes"][0]["steps"]
    # The timeline read a moment before /recorder: it has at most the steps of that moment, and no duplicate.
    starts = [s["start_ns"] for s in steps if s["end_ns"] <= body["read_ns"] and s["start_ns"] >= body["since_ns"]]
    assert abs(held - len(starts)) <= 2, (held, len(starts))
    # A wider window is read whole once.
    await _json(client, "/recorder/timeline", seconds="600")
    assert store.whole_reads == 2


async def test_the_timeline_of_no_engine_is_empty_and_bad_parameters_are_named(sidecar):
    client = await sidecar()
    body = await _json(client, "/recorder/timeline")
    assert body["processes"] == [] and body["in_flight"]["count"] == 0 and body["points"] == 300
    for params, name in (({"seconds": "5"}, "seconds"), ({"seconds": "7200"}, "seconds"), ({"seconds": "x"}, "seconds"),
                         ({"points": "2"}, "points"), ({"points": "5000"}, "points"), ({"points": "10.5"}, "points"),
                         ({"slow_ms": "-1"}, "slow_ms"), ({"gc_ms": "nan"}, "gc_ms"), ({"since": "1"}, "since")):
        resp = await client.get("/recorder/timeline", params=params)
        assert resp.status == 400, params
        answer = await resp.json()
        assert answer["error"] == "bad_parameter" and answer["param"] == name, answer
