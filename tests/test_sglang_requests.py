"""SGLang's finished requests as the telemetry takes them (plugins/sidecar_sglang/requests.py): times
from SGLang's own stats on its perf_counter clock, made wall-clock; tokens and finish reason from the
batch; the queue from the scheduler's stats only where it sent them."""

import asyncio
from types import SimpleNamespace

from sidecar_sglang import requests as sg


def state(created, first, finished, max_new_tokens=16, done=True):
    stats = SimpleNamespace(created_time=created, first_token_time=first, finished_time=finished)
    return SimpleNamespace(time_stats=stats, obj=SimpleNamespace(sampling_params={"max_new_tokens": max_new_tokens}),
                           finished=done)


def batch(rids, reasons, scheduler=None):
    n = len(rids)
    return SimpleNamespace(rids=rids, finished_reasons=reasons, prompt_tokens=[11] * n, completion_tokens=[7] * n,
                           cached_tokens=[3] * n, time_stats=scheduler)


def test_times_tokens_and_reason():
    req = sg.finished_request(state(100.0, 100.25, 101.0), batch(["r1"], [{"type": "length", "length": 7}]),
                              0, "tiny", now_wall=5000.0, now_mono=102.0)
    assert req.request_id == "r1" and req.model == "tiny" and req.finish_reason == "length"
    assert req.arrival_time == 4998.0 and req.finished_time == 4999.0
    assert req.time_to_first_token == 0.25 and req.first_token_ts == 100.25 and req.last_token_ts == 101.0
    assert (req.input_tokens, req.output_tokens, req.cached_input_tokens, req.max_tokens) == (11, 7, 3, 16)
    assert req.queued_ts == 100.0 and req.scheduled_ts == 0.0, "no scheduler stats: no queue span"


def test_the_schedulers_stats_give_the_queue():
    sched = [SimpleNamespace(wait_queue_entry_time=100.01, forward_entry_time=100.2)]
    req = sg.finished_request(state(100.0, 100.25, 101.0), batch(["r1"], [{"type": "stop"}], sched), 0, "m", 5000.0, 102.0)
    assert req.queued_ts == 100.01 and req.scheduled_ts == 100.2 and req.finish_reason == "stop"


def test_the_wrapper_records_only_requests_the_batch_finished():
    recorded = []
    inst = SimpleNamespace(record_finished=recorded.append)
    done, running = state(1.0, 1.1, 1.5), state(1.0, 1.1, 0.0, done=False)

    class Manager:
        served_model_name = "tiny"

        def __init__(self):
            self.rid_to_state = {"a": done, "b": running}
            self.__dict__[sg.INSTRUMENT_ATTR] = inst

    async def original(self, recv_obj):
        self.rid_to_state.pop("a", None)  # SGLang deletes a finished request's state
        return "handled"

    wrapped = sg.wrap_handle_batch_output(original)
    manager = Manager()
    assert asyncio.run(wrapped(manager, batch(["a", "b"], [{"type": "stop"}, None]))) == "handled"
    assert [r.request_id for r in recorded] == ["a"]
    # A state without what this SGLang should have: the request goes unrecorded, logged once, and
    # the batch is handled all the same.
    manager.rid_to_state["b"] = SimpleNamespace(finished=True, time_stats=None, obj=None)
    assert asyncio.run(wrapped(manager, batch(["b"], [{"type": "stop"}]))) == "handled"
    assert [r.request_id for r in recorded] == ["a"] and manager.__dict__["_inference_sidecar_requests_warned"]
