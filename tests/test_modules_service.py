"""/modules/* (issue 13 part 3) against real probes in real processes (tests/fake_engine.py): a worker
whose probe knows its model, an engine core and an API server that have none."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from sidecar.cli.modules import describe_modules
from sidecar.common.verdicts import FINAL
from test_service import sidecar, engines, wait_processes  # noqa: F401  (fixtures)

API_MD = Path(__file__).resolve().parents[1] / "docs" / "api.md"


async def wait_job(client, job_id, timeout=60):
    for _ in range(int(timeout * 10)):
        body = await (await client.get(f"/modules/{job_id}")).json()
        if body["state"] in FINAL:
            return body
        await asyncio.sleep(0.1)
    raise AssertionError(f"module timing still {body['state']}")


def documented_example() -> dict:
    text = API_MD.read_text()
    block = text[text.index("### `GET /modules/{id}`"):]
    return json.loads(re.search(r"```json\n(.*?)```", block, re.S).group(1))


async def test_the_model_is_timed_in_the_process_that_runs_it_and_the_hooks_are_gone(sidecar, engines):  # noqa: F811
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0", "--model", "--size", "64")
    engines(client.url, "engine_core")
    engines(client.url, "api_server")
    await wait_processes(client, 3)

    resp = await client.get("/modules/start", params={"steps": "4"})
    assert resp.status == 202, await resp.text()
    started = await resp.json()
    assert started["url"] == f"/modules/{started['id']}" and started["id"].startswith("m")
    assert [p.split(" (")[0] for p in started["processes"]] == ["worker rank 0"], "only where a model is"
    busy = await client.get("/profile/start", params={"steps": "1"})
    assert busy.status == 409 and (await busy.json())["error"] == "module_timing_in_progress"

    job = await wait_job(client, started["id"])
    assert job["state"] == "done", job
    assert job["clock"] == "cpu" and job["hooks_left"] == 0
    [process] = job["processes"]
    assert process["hooks_before"] == process["hooks_after"] == 0 and process["steps_recorded"] == 4
    rows = {m["path"]: m for m in job["modules"]}
    assert rows[""]["type"] == "ModelOfTheFake" and rows[""]["calls"] == 4 and rows[""]["share"] == 1.0
    for block in (0, 1):
        assert rows[f"blocks.{block}.mlp.0"]["type"] == "Linear" and rows[f"blocks.{block}.mlp.0"]["calls"] == 4
        assert rows[f"blocks.{block}.norm"]["type"] == "LayerNorm"
    assert sum(m["self_share"] for m in job["modules"]) == pytest.approx(1.0, abs=2e-3)
    assert job["forward_ms"] == pytest.approx(rows[""]["total_ms"])
    assert job["forward_ms_per_step"] == pytest.approx(job["forward_ms"] / 4, rel=1e-3)
    types = {t["type"]: t for t in job["types"]}
    assert types["Linear"]["calls"] == 16 and types["GELU"]["calls"] == 8

    # What docs/api.md shows is what the service returns, both ways.
    doc = documented_example()
    assert set(doc) == set(job), set(doc) ^ set(job)
    assert set(doc["modules"][0]) == set(job["modules"][0]) and set(doc["types"][0]) == set(job["types"][0])
    assert set(doc["processes"][0]) == set(process)

    listed = (await (await client.get("/modules")).json())["jobs"]
    assert [j["id"] for j in listed] == [job["id"]] and listed[0] == job
    home = await (await client.get("/")).text()  # the home page lists it, with its slowest module
    slowest = max(job["modules"], key=lambda m: m["self_ms"])
    assert f'href="/modules/{job["id"]}"' in home and "Module timing" in home
    assert f"{slowest['path'] or 'the model'} ({slowest['type']}): {slowest['self_ms']:.3f} ms self" in home
    text = describe_modules(job)
    assert "blocks.0.mlp.0" in text and "by module type" in text and "hooks left: 0" in text


async def test_bad_input_and_a_busy_board(sidecar, engines):  # noqa: F811
    client = await sidecar()
    engines(client.url, "engine_core")
    await wait_processes(client, 1)
    none = await client.get("/modules/start", params={"steps": "3"})
    assert none.status == 503 and "model" in (await none.json())["message"], "no process has a model"
    engines(client.url, "worker", "--rank", "0", "--model", "--steps-then-idle", "0")
    await wait_processes(client, 2)
    for params, name in [({"steps": "0"}, "steps"), ({"steps": "101"}, "steps"), ({"steps": "x"}, "steps"),
                         ({"steps": "99999999999999999999999"}, "steps"), ({}, "steps"), ({"steps": "2", "what": "1"}, "what"),
                         ({"steps": "2", "processes": "engine_core"}, "processes"),
                         ({"steps": "2", "timeout_s": "0"}, "timeout_s")]:
        resp = await client.get("/modules/start", params=params)
        assert resp.status == 400, params
        body = await resp.json()
        assert body["error"] == "bad_parameter" and body["param"] == name, (params, body)
    first = await client.post("/modules/start", params={"steps": "3"})
    assert first.status == 202
    job_id = (await first.json())["id"]
    again = await client.get("/modules/start", params={"steps": "3"})
    assert again.status == 409 and (await again.json())["error"] == "module_timing_in_progress"
    scan = await client.get("/sync/start", params={"steps": "3"})
    assert scan.status == 409 and (await scan.json())["active"] == job_id
    stopped = await client.post("/modules/stop")
    assert stopped.status == 200
    job = await wait_job(client, job_id)
    assert job["state"] == "cancelled" and job["hooks_left"] is None  # the idle worker never began
    assert (await client.post("/modules/stop")).status == 409
    missing = await client.get("/modules/m20990101-000000-abcdef")
    assert missing.status == 404 and (await missing.json())["error"]
