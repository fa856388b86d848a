"""SGLang's requests in flight as its scheduler holds them (plugins/sidecar_sglang/requests_view.py):
the phase from where each request is, one row per request, finished ones left out, arrival on the
wall clock from SGLang's perf_counter stamps. The objects are stand-ins with the fields SGLang's
``Scheduler`` and ``Req`` have (tests/test_sglang_targets.py checks those fields in the wheels)."""

import time
from types import SimpleNamespace

from sidecar_sglang.requests_view import requests_in_flight


def req(rid, prompt=5, output=0, done=False, retracted=0, created=0.0, received=0.0):
    return SimpleNamespace(rid=rid, origin_input_ids=list(range(prompt)), output_ids=list(range(output)),
                           retraction_count=retracted, finished=lambda: done,
                           time_stats=SimpleNamespace(created_time=created, scheduler_recv_time=received))


def scheduler(waiting=(), running=(), last=(), planned=None, chunked=None):
    batch = lambda reqs: SimpleNamespace(reqs=list(reqs))  # noqa: E731
    return SimpleNamespace(waiting_queue=list(waiting), running_batch=batch(running),
                           last_batch=batch(last) if last else None,
                           cur_batch_for_debug=batch(planned) if planned is not None else None,
                           chunked_req=chunked)


def test_each_request_once_with_its_phase():
    now = time.perf_counter()
    decoding = req("dec", output=4, created=now - 3.0)
    prefilling = req("pre", prompt=9, created=now - 2.0)  # in the batch being run, not yet in running_batch
    rows = requests_in_flight(scheduler(
        waiting=[req("q", created=now - 1.0), req("back", output=2, retracted=1, created=now - 4.0)],
        running=[decoding, req("gone", output=3, done=True, created=now - 5.0)],
        last=[decoding], planned=[prefilling],
        chunked=req("chunk", prompt=300, created=now - 0.5)))
    assert [(r["id"], r["phase"]) for r in rows] == [
        ("back", "preempted"), ("dec", "decode"), ("pre", "prefill"), ("q", "queued"), ("chunk", "prefill")]
    by_id = {r["id"]: r for r in rows}
    assert by_id["pre"]["prompt_tokens"] == 9 and by_id["pre"]["output_tokens"] == 0
    assert by_id["dec"]["output_tokens"] == 4
    assert 2.9 < by_id["dec"]["age_s"] < 4.0
    assert abs(by_id["dec"]["arrived_ns"] / 1e9 - (time.time() - 3.0)) < 1.0


def test_waiting_wins_over_a_stale_batch_and_the_receipt_stands_in_for_the_arrival():
    now = time.perf_counter()
    back = req("r", output=3, retracted=1, received=now - 1.5)  # no created_time: not given by the HTTP server
    (row,) = requests_in_flight(scheduler(waiting=[back], last=[back]))
    assert row["phase"] == "preempted" and 1.4 < row["age_s"] < 2.5


def test_an_idle_scheduler_has_none():
    assert requests_in_flight(scheduler()) == []
