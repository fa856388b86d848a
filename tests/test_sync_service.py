"""/sync/* against real probes in real processes with a planted .item() (CPU treated as a device)."""

import asyncio
from pathlib import Path

from sidecar.common.verdicts import FINAL
from test_service import FAKE_ENGINE, sidecar, engines, wait_processes  # noqa: F401  (fixtures)

PLANTED_LINE = next(n for n, line in enumerate(FAKE_ENGINE.read_text().splitlines(), 1) if "# PLANTED_LINE" in line)


async def wait_scan(client, scan_id, timeout=60):
    for _ in range(int(timeout * 10)):
        body = await (await client.get(f"/sync/{scan_id}")).json()
        if body["state"] in FINAL:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"scan still {body['state']}")


async def test_scan_finds_the_planted_line_and_baseline_hides_it(sidecar, engines, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SIDECAR_SYNC_TREAT_CPU_AS_DEVICE", "1")
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--planted-sync")
    engines(client.url, "engine_core")
    engines(client.url, "api_server")
    await wait_processes(client, 3)

    resp = await client.get("/sync/start", params={"steps": "4"})
    assert resp.status == 202
    started = await resp.json()
    assert started["url"] == f"/sync/{started['id']}"
    assert sorted(started["processes"])[0].startswith("engine core"), "the API server takes no steps: not scanned"
    busy = await client.get("/profile/start", params={"steps": "1"})
    assert busy.status == 409 and (await busy.json())["error"] == "scan_in_progress"
    result = await wait_scan(client, started["id"])
    assert result["state"] == "done", result
    assert result["treat_cpu_as_device"] is True
    hidden = [s for s in result["sites"] if s["classification"] == "hidden"]
    assert [(Path(s["file"]).name, s["line"], s["op"]) for s in hidden] == [("fake_engine.py", PLANTED_LINE, "item")]
    assert hidden[0]["count"] == 4 and hidden[0]["count_per_step"] == 1.0
    assert hidden[0]["processes"] == [next(p["label"] for p in result["processes"] if p["role"] == "worker")]
    assert not any("sidecar" in s["file"] for s in result["sites"]), "nothing from the project's own code"

    again = await (await client.post("/sync/start", params={"steps": "2", "baseline": started["id"]})).json()
    second = await wait_scan(client, again["id"])
    assert second["state"] == "done" and second["baseline"] == started["id"]
    assert len([s for s in second["sites"] if s["classification"] == "hidden"]) == 1
    assert second["new_sites"] == [], "the same site is not new against the baseline"
    listed = [s["id"] for s in (await (await client.get("/syncs")).json())["scans"]]
    assert listed == [again["id"], started["id"]]

    metrics = await (await client.get("/metrics")).text()
    line = next(l for l in metrics.splitlines() if l.startswith("sidecar_sync_site_hits_total{") and "fake_engine.py" in l)
    assert 'classification="hidden"' in line and 'op="item"' in line and line.endswith(" 6.0")


async def test_scan_parameters_and_conflicts(sidecar, engines):  # noqa: F811
    client = await sidecar()
    assert (await client.get("/sync/start", params={"steps": "3"})).status == 503
    engines(client.url, "worker", "--rank", "0", "--steps-then-idle", "0")
    await wait_processes(client, 1)
    for params, name in [({"steps": "0"}, "steps"), ({"steps": "x"}, "steps"), ({"steps": "2", "baseline": "../etc"}, "baseline"),
                         ({"steps": "2", "baseline": "s20990101-000000-abcdef"}, "baseline"), ({"steps": "2", "what": "1"}, "what"),
                         ({"steps": "2", "processes": "api_server"}, "processes")]:
        resp = await client.get("/sync/start", params=params)
        assert resp.status == 400, params
        assert (await resp.json())["param"] == name
    first = await client.get("/sync/start", params={"steps": "3"})
    assert first.status == 202
    scan_id = (await first.json())["id"]
    assert (await client.get("/sync/start", params={"steps": "3"})).status == 409
    assert (await client.post("/sync/stop")).status == 200
    result = await wait_scan(client, scan_id)
    assert result["state"] == "cancelled" and result["reason"] == "cancelled by the user before any step was recorded"
    assert (await client.post("/sync/stop")).status == 409
    assert (await client.get("/sync/s20990101-000000-abcdef")).status == 404


WATCHED_LINE = next(n for n, line in enumerate(FAKE_ENGINE.read_text().splitlines(), 1) if "# WATCHED_LINE" in line)


async def test_always_on_watch_reaches_the_sidecar(sidecar, engines):  # noqa: F811
    """A probe's always-on watch (on tests/fake_cuda.py's stand-in for CUDA's sync debug mode) goes
    out in its heartbeats: /syncs/watch merges it, /metrics counts it; another process without a
    watch adds nothing."""
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--fake-cuda-watch", "4")
    engines(client.url, "engine_core")
    await wait_processes(client, 2)
    for _ in range(300):
        body = await (await client.get("/syncs/watch")).json()
        if body["sites"] and body["sites"][0]["count"] >= 3:
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"no watch report: {body}")
    [process] = body["processes"]
    assert process["process"].startswith("worker") and process["state"] == "watching" and process["every"] == 4
    assert process["sampled_steps"] >= 3 and process["errors"] == 0
    [site] = body["sites"]
    assert (Path(site["file"]).name, site["line"], site["op"]) == ("fake_engine.py", WATCHED_LINE, "cuda_sync")
    assert site["classification"] == "hidden" and site["processes"] == [process["process"]]
    assert site["count_per_step"] == 1.0, "one sync per sampled step, every sampled step"

    metrics = await (await client.get("/metrics")).text()
    line = next(l for l in metrics.splitlines() if l.startswith("sidecar_sync_watch_calls_total{"))
    assert f'site="' in line and f'fake_engine.py:{WATCHED_LINE}"' in line and 'classification="hidden"' in line
    assert float(line.rsplit(" ", 1)[1]) >= 3


async def test_watch_asked_for_without_cuda_says_why(sidecar, engines, monkeypatch):  # noqa: F811
    monkeypatch.setenv("SIDECAR_SYNC_WATCH", "1")
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    for _ in range(100):
        body = await (await client.get("/syncs/watch")).json()
        if body["processes"]:
            break
        await asyncio.sleep(0.1)
    [process] = body["processes"]
    assert process["state"] == "unavailable" and "CUDA is not available" in process["reason"]
    assert body["sites"] == []
