"""The module-timing job in one process (issue 13 part 3): hooks on every module of a real Llama
(transformers, random weights), timed on the host clock, and nothing left behind once it ends."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sidecar.probe.modules_timer import ModuleTimer, hook_count
from sidecar.probe.modules_job import ModuleTiming
from sidecar.common.protocol import ModuleSpec


@pytest.fixture(scope="module")
def llama(tiny_model):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()  # the session's model


def forward(model):
    with torch.no_grad():
        model(torch.randint(0, model.config.vocab_size, (2, 8)))


def no_hooks_left(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not m._forward_hooks_always_called
               and not m._forward_hooks_with_kwargs and not m._forward_pre_hooks_with_kwargs for m in model.modules())


def test_every_module_is_timed_and_self_times_add_up_to_the_forward(llama):
    timer = ModuleTimer(llama)
    timer.install()
    assert hook_count(llama) == 2 * len(list(llama.named_modules()))
    for _ in range(2):
        forward(llama)
    handles = list(timer.handles)
    timer.remove()
    rows = {r["path"]: r for r in timer.rows()}
    assert rows[""]["type"] == "LlamaForCausalLM" and rows[""]["calls"] == 2
    layers = llama.config.num_hidden_layers
    for i in range(layers):
        assert rows[f"model.layers.{i}"]["type"] == "LlamaDecoderLayer" and rows[f"model.layers.{i}"]["calls"] == 2
        assert rows[f"model.layers.{i}.self_attn.q_proj"]["type"] == "Linear"
    # The outermost call holds every other: the self times share its time out exactly.
    assert sum(r["self_ns"] for r in rows.values()) == rows[""]["total_ns"]
    assert all(0 <= r["self_ns"] <= r["total_ns"] for r in rows.values())
    # Only the model's own calls had no timed module around them: the forward is theirs.
    assert rows[""]["outer_ns"] == rows[""]["total_ns"] and not any(r["outer_ns"] for p, r in rows.items() if p)
    # Nothing left: no hook on any module, and every handle's id gone from every dict it was in.
    assert hook_count(llama) == 0 and no_hooks_left(llama)
    assert not timer.handles
    assert len(handles) == 2 * len(list(llama.named_modules()))
    for handle in handles:
        dicts = [handle.hooks_dict_ref(), *(ref() for ref in handle.extra_dict_ref)]
        assert all(handle.id not in d for d in dicts if d is not None)


def test_calls_on_another_thread_are_not_this_steps(llama):
    timer = ModuleTimer(llama)
    timer.install()
    other = threading.Thread(target=forward, args=(llama,))
    other.start()
    other.join()
    forward(llama)
    timer.remove()
    assert {r["path"]: r["calls"] for r in timer.rows()}[""] == 1


def run_job(model_of, steps, exporter, model_for_steps=None, armed_steps=0):
    reports = []
    done = threading.Event()

    def report(msg):
        reports.append(msg)
        if msg.state in ("done", "failed"):
            done.set()

    job = ModuleTiming(ModuleSpec(id="m20260101-000000-abcdef", steps=steps), report, model_of, exporter)
    job.report_armed(armed_steps)
    job.begin(armed_steps + 1)
    for n in range(armed_steps, armed_steps + steps + 3):
        job.on_step_begin(True, n)
        if model_for_steps is not None:
            forward(model_for_steps)
        job.on_step_end(True)
    assert done.wait(30)
    return job, reports


def test_the_job_times_n_working_steps_and_takes_every_hook_out(llama):
    with ThreadPoolExecutor(1) as exporter:
        job, reports = run_job(lambda: llama, 3, exporter, model_for_steps=llama, armed_steps=5)
    assert [r.state for r in reports] == ["armed", "timing", "done"]
    done = reports[-1]
    assert done.steps_recorded == 3 and done.first_step == 6 and done.clock == "cpu"
    assert done.hooks_before == done.hooks_after == 0 and no_hooks_left(llama)
    rows = {r.path: r for r in done.rows}
    assert rows[""].calls == 3 and rows["model.layers.0.mlp"].calls == 3  # the window's steps, no more
    assert sum(r.self_ns for r in rows.values()) == rows[""].total_ns


def test_a_hook_of_the_users_own_stays(llama):
    seen = []
    own = llama.model.norm.register_forward_hook(lambda *a: seen.append(1))
    try:
        with ThreadPoolExecutor(1) as exporter:
            _, reports = run_job(lambda: llama, 2, exporter, model_for_steps=llama)
        assert reports[-1].hooks_before == reports[-1].hooks_after == 1
        assert list(llama.model.norm._forward_hooks) == [own.id]
    finally:
        own.remove()


def test_no_model_yet_fails_the_job_and_leaves_the_step_alone():
    with ThreadPoolExecutor(1) as exporter:
        job, reports = run_job(lambda: None, 2, exporter)
    assert reports[-1].state == "failed" and "no model loaded yet" in reports[-1].error
    assert job.finished


def test_a_forward_that_raises_still_unwinds_its_calls(llama):
    timer = ModuleTimer(llama)
    timer.install()
    with pytest.raises(Exception):
        with torch.no_grad():
            llama(torch.full((1, 4), 10**9))  # an id beyond the vocabulary: the embedding raises
    forward(llama)
    timer.remove()
    rows = {r["path"]: r for r in timer.rows()}
    assert rows[""]["calls"] == 2 and rows["model.layers.0"]["calls"] == 1
    assert no_hooks_left(llama)


class HostEvent:
    """torch.cuda.Event's interface on the host clock: the event bookkeeping of the CUDA path (nesting,
    self and outermost time from event pairs) checked where there is no GPU; tests/gpu has none of it."""

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None
        self.waited = False

    def record(self):
        self.at = time.perf_counter_ns()

    def synchronize(self):
        self.waited = True

    def elapsed_time(self, end):
        assert end.waited, "read before the end event was waited for"
        return (end.at - self.at) / 1e6  # ms, as CUDA's


def test_the_event_path_nests_calls_as_the_host_clock_path_does(llama):
    timer = ModuleTimer(llama, event=HostEvent)
    timer.install()
    for _ in range(2):
        forward(llama)
    timer.remove()
    rows = {r["path"]: r for r in timer.rows()}
    assert rows[""]["calls"] == 2 and rows["model.layers.0.mlp.down_proj"]["calls"] == 2
    assert rows[""]["outer_ns"] == rows[""]["total_ns"] and rows["model.layers.0"]["outer_ns"] == 0
    assert sum(r["self_ns"] for r in rows.values()) == pytest.approx(rows[""]["total_ns"], abs=len(rows) * 2)
    assert no_hooks_left(llama)
