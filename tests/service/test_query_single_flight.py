"""One costly query at a time per engine process, on the sidecar's side (issue 27, item 3).

``/stacks`` (a snapshot or a sampling), ``/stacks?mode=native`` and ``/recorder``: while one of them is in
flight to a process, another one that selects it is a JSON 429 with ``Retry-After``, and nothing more is
sent to the probe. Most tests use a stand-in probe that answers only when the test says so, so a query is
in flight exactly as long as the test needs (no sleeps); the last one uses a real probe in a real process.
"""

import asyncio
import json

from sidecar.common.protocol import Answer, Query
from sidecar.service.routes.keys import QUERIES, REGISTRY
from sidecar.service.incidents.recorder_dump import gather_recording

from service_fakes import FakeWebSocket, identity
from test_service import engines, settings, sidecar, wait_processes  # noqa: F401 (fixtures)

SAMPLING = {"seconds": 2.0, "hz": 100.0, "samples": 0, "frames": [], "stacks": [], "truncated": False}


class HeldProbe(FakeWebSocket):
    """A connected probe whose queries wait until the test answers them (``answer``)."""

    def __init__(self, app, role: str, rank: int | None = None) -> None:
        super().__init__()
        self.app = app
        self.queries: asyncio.Queue = asyncio.Queue()
        self.conn = app[REGISTRY].add(identity(role, rank), self)

    async def send_str(self, text: str) -> None:
        await super().send_str(text)
        if isinstance(self.sent[-1], Query):
            self.queries.put_nowait(self.sent[-1])

    async def next_query(self) -> Query:
        return await asyncio.wait_for(self.queries.get(), 10)

    def answer(self, query: Query, **fields) -> None:
        self.app[QUERIES].on_answer(self.conn, Answer(query_id=query.query_id, kind=query.kind, **fields))


async def _sampling_in_flight(client, probe: HeldProbe, **params):
    """A ``/stacks?seconds=2`` request whose query the probe has received and not answered yet."""
    request = asyncio.ensure_future(client.get("/stacks", params={"seconds": "2", **params}))
    query = await probe.next_query()
    assert query.kind == "stacks" and query.seconds == 2
    return request, query


async def _assert_busy(resp, *names_in_message: str) -> dict:
    body = await resp.json()
    assert resp.status == 429, body
    assert body["error"] == "query_in_progress" and isinstance(body["message"], str), body
    for name in names_in_message:
        assert name in body["message"], body
    retry = resp.headers["Retry-After"]
    assert retry.isdigit() and int(retry) >= 1, retry
    return body


async def test_a_second_stacks_sampling_is_429_while_the_first_runs_and_then_free_again(sidecar):
    client = await sidecar()
    probe = HeldProbe(client.app, "worker", 0)
    first, query = await _sampling_in_flight(client, probe)

    second = await client.get("/stacks", params={"seconds": "2"})
    body = await _assert_busy(second, probe.conn.identity.label, "stacks sampling of 2 s")
    assert 1 <= int(second.headers["Retry-After"]) <= 2  # what is left of the running 2 s sampling
    assert [p["process"] for p in body["processes"]] == [probe.conn.identity.label]
    assert probe.queries.empty(), "a second query reached the probe"

    probe.answer(query, data=SAMPLING)
    done = await first
    assert done.status == 200, await done.text()
    # The slot is free again: the next sampling reaches the probe and succeeds.
    third, query = await _sampling_in_flight(client, probe)
    probe.answer(query, data=SAMPLING)
    assert (await third).status == 200


async def test_a_snapshot_a_native_dump_and_a_recorder_dump_share_the_one_slot(sidecar, monkeypatch):
    from sidecar.stacks import native as native_stacks

    looked_for_py_spy = []
    monkeypatch.setattr(native_stacks.shutil, "which", lambda name: looked_for_py_spy.append(name))
    client = await sidecar()
    probe = HeldProbe(client.app, "worker", 0)
    first, query = await _sampling_in_flight(client, probe)
    for path, params in (("/stacks", {}), ("/stacks", {"mode": "native"}), ("/recorder", {"seconds": "60"})):
        await _assert_busy(await client.get(path, params=params), "stacks sampling of 2 s")
    assert probe.queries.empty() and not looked_for_py_spy
    # /requests is cheap and answered from the probe's link thread: never held up by the slot.
    requests = asyncio.ensure_future(client.get("/requests"))
    asked = await probe.next_query()
    assert asked.kind == "requests"
    probe.answer(asked, data={"known": False, "requests": []})
    assert (await requests).status == 200
    probe.answer(query, data=SAMPLING)
    assert (await first).status == 200


async def test_only_the_busy_processes_of_a_selection_refuse(sidecar):
    client = await sidecar()
    worker = HeldProbe(client.app, "worker", 0)
    core = HeldProbe(client.app, "engine_core")
    first, query = await _sampling_in_flight(client, worker, processes="worker")
    # The engine core is free: a snapshot of it alone goes through.
    snapshot = asyncio.ensure_future(client.get("/stacks", params={"processes": "engine_core"}))
    asked = await core.next_query()
    core.answer(asked, data={"taken_ns": 1, "threads": []})
    assert (await snapshot).status == 200
    # Every process: the worker is busy, so none is asked, and only the worker is named.
    body = await _assert_busy(await client.get("/stacks"), worker.conn.identity.label)
    assert core.conn.identity.label not in body["message"]
    assert worker.queries.empty() and core.queries.empty()
    worker.answer(query, data=SAMPLING)
    assert (await first).status == 200


async def test_a_lost_probe_frees_its_slot(sidecar):
    client = await sidecar()
    app = client.app
    probe = HeldProbe(app, "worker", 0)
    first, _query = await _sampling_in_flight(client, probe)
    # What the probe channel does when the websocket ends (probe_channel.py).
    app[REGISTRY].remove(probe.conn)
    app[QUERIES].on_probe_lost(probe.conn)
    assert app[QUERIES].slots.busy([probe.conn]) == []
    lost = await first
    assert lost.status == 502 and "disconnected" in (await lost.json())["message"]
    # The process comes back (a new connection): its sampling is not refused.
    back = HeldProbe(app, "worker", 0)
    again, query = await _sampling_in_flight(client, back)
    back.answer(query, data=SAMPLING)
    assert (await again).status == 200


async def test_a_probe_that_answers_busy_is_a_429_with_its_retry_after(sidecar):
    """The sidecar's slot is free but the probe still runs a sampling (a previous sidecar's, or one the
    sidecar stopped waiting for): the probe's own refusal comes back as a 429 too, not as a 502."""
    from sidecar.probe.queries import busy_error

    client = await sidecar()
    probe = HeldProbe(client.app, "worker", 0)
    request = asyncio.ensure_future(client.get("/stacks", params={"seconds": "2"}))
    query = await probe.next_query()
    probe.answer(query, error=busy_error("a stacks sampling of 60 s", 42.3))
    resp = await request
    await _assert_busy(resp, "a stacks sampling of 60 s")
    assert resp.headers["Retry-After"] == "43"


async def test_a_triggers_recording_waits_for_the_slot_and_covers_the_seconds_before_it(sidecar, tmp_path):
    """A trigger's firing has nobody to retry it: its recorder dump waits for the running sampling to end,
    then asks for enough seconds to cover the 30 before the firing."""
    client = await sidecar()
    probe = HeldProbe(client.app, "worker", 0)
    first, query = await _sampling_in_flight(client, probe)
    gathering = asyncio.ensure_future(gather_recording(client.app[QUERIES], [probe.conn], 30))
    for _ in range(20):  # let it run as far as it can
        await asyncio.sleep(0)
    assert probe.queries.empty(), "the recorder was asked while a sampling ran"
    probe.answer(query, data=SAMPLING)
    assert (await first).status == 200
    asked = await probe.next_query()
    assert asked.kind == "recorder" and asked.seconds >= 30 and asked.packed
    # Answered as a probe that predates packed rows answers (Query.packed ignored): JSON, read as before.
    dump = tmp_path / "recorder" / f"{probe.conn.identity.probe_file_stem}-q{asked.query_id}.json"
    dump.parent.mkdir()
    dump.write_text(json.dumps({"steps": {}}))
    probe.answer(asked, file=str(dump))
    answers, since_ns, until_ns = await asyncio.wait_for(gathering, 10)
    ((process, got, error),) = answers
    assert error is None and got is not None and until_ns - since_ns == 30 * 10**9


async def test_a_triggers_recording_that_never_gets_the_slot_names_the_busy_process(sidecar):
    client = await sidecar()
    probe = HeldProbe(client.app, "worker", 0)
    first, query = await _sampling_in_flight(client, probe)
    answers, _, _ = await gather_recording(client.app[QUERIES], [probe.conn], 30, slot_wait_s=0.05)
    ((process, dump, error),) = answers
    assert process["label"] == probe.conn.identity.label and dump is None
    assert error.startswith("busy:") and "stacks sampling of 2 s" in error
    assert probe.queries.empty()
    probe.answer(query, data=SAMPLING)
    assert (await first).status == 200


async def test_two_concurrent_samplings_of_a_real_probe_one_200_one_429(sidecar, engines):
    client = await sidecar()
    engines(client.url, "worker", "--rank", "0")
    await wait_processes(client, 1)
    one, two = await asyncio.gather(*(client.get("/stacks", params={"seconds": "2", "hz": "100"}) for _ in range(2)))
    ok, busy = sorted((one, two), key=lambda r: r.status)
    assert (ok.status, busy.status) == (200, 429), (ok.status, busy.status)
    assert (await ok.json())["processes"][0]["error"] is None
    await _assert_busy(busy, "worker rank 0", "stacks sampling of 2 s")
    # Once it has ended, the next one succeeds.
    again = await client.get("/stacks", params={"seconds": "0.2", "hz": "100"})
    assert again.status == 200, await again.text()
    assert (await again.json())["processes"][0]["error"] is None
