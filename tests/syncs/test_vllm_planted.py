"""End to end: real vLLM (single process) runs the planted model; a SyncScan driven through the
worker's step finds exactly the planted lines as hidden, vLLM's deliberate transfer as expected, and
nothing in this project's code."""

from __future__ import annotations

import gc
import os
import threading

import pytest

pytestmark = pytest.mark.vllm

STEPS = 3
ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "SIDECAR_DISABLE": "1",  # this test drives its own scan; the project's probe stays out
    "SIDECAR_SYNC_TREAT_CPU_AS_DEVICE": "1",
}


class WorkerStepDriver:
    """Calls a scan's step interface around the worker's step, as plugins/sidecar_vllm/hooks.py
    does: the step begins in execute_model and ends there, or in sample_tokens when sampling is
    deferred to it."""

    def __init__(self, scan) -> None:
        self.scan = scan
        self.pending = None
        self.threads = set()
        self.steps = 0  # working steps so far: the probe's count, which the scan's window is set in

    def end_step(self, did_work: bool) -> None:
        self.scan.on_step_end(did_work)
        self.steps += did_work

    def install(self, monkeypatch) -> None:
        from vllm.v1.worker.gpu_worker import Worker

        execute_model, sample_tokens = Worker.execute_model, Worker.sample_tokens
        driver = self

        def wrapped_execute_model(worker, scheduler_output, *args, **kwargs):
            driver.threads.add(threading.get_ident())
            has_work = scheduler_output.total_num_scheduled_tokens > 0
            driver.scan.on_step_begin(has_work, driver.steps)
            result = execute_model(worker, scheduler_output, *args, **kwargs)
            if result is None:
                driver.pending = has_work
            else:
                driver.end_step(has_work)
            return result

        def wrapped_sample_tokens(worker, *args, **kwargs):
            result = sample_tokens(worker, *args, **kwargs)
            if driver.pending is not None:
                pending, driver.pending = driver.pending, None
                driver.end_step(pending)
            return result

        monkeypatch.setattr(Worker, "execute_model", wrapped_execute_model)
        monkeypatch.setattr(Worker, "sample_tokens", wrapped_sample_tokens)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    try:
        from planted_sync_model import ARCHITECTURE, make_model_dir
        import vllm

        model_dir = make_model_dir(tmp_path_factory.mktemp("planted") / "model")
        engine = vllm.LLM(
            model=str(model_dir),
            dtype="float32",
            max_model_len=256,
            enforce_eager=True,
            distributed_executor_backend="uni",
            seed=0,
        )
        assert engine.llm_engine.model_config.architectures == [ARCHITECTURE]
        yield engine
        del engine
        gc.collect()  # frees the 1 GiB KV cache before the next module runs
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def test_scan_reports_exactly_the_planted_lines(llm, monkeypatch):
    import vllm
    from planted_sync_model.model import PLANTED_FILE, PLANTED_SYNCS

    from sidecar.syncs import Allowlist, SyncDetector, SyncScan, SyncSpec
    from sidecar_vllm.profile import VLLM_PROFILE

    messages = []
    # What a vLLM process's probe builds: the vLLM profile's phase rules, skipped packages and allowlist.
    scan = SyncScan(SyncSpec(id="e2e", steps=STEPS), messages.append, allowlist=Allowlist(VLLM_PROFILE.allow_entries),
                    detector=SyncDetector(locator=VLLM_PROFILE.site_locator()))
    scan.begin(0)  # from the first working step: what the sidecar's begin message does
    driver = WorkerStepDriver(scan)
    driver.install(monkeypatch)
    outputs = llm.generate(["hello world", "the model"], vllm.SamplingParams(max_tokens=STEPS + 2, temperature=0))
    assert all(len(o.outputs[0].token_ids) == STEPS + 2 for o in outputs)

    assert scan.finished
    assert [m.state for m in messages] == ["scanning", "done"]  # sidecar.common.protocol.SyncReport
    report = messages[-1]
    assert report.steps_recorded == STEPS and report.treat_cpu_as_device is True
    sites = report.sites

    hidden = sorted((s["line"], s["op"]) for s in sites if s["classification"] == "hidden")
    assert hidden == sorted(PLANTED_SYNCS)
    for s in sites:
        if s["classification"] == "hidden":
            assert s["file"] == PLANTED_FILE
            assert s["function"] == "planted_syncs"
            assert s["phase"] == "forward"
            assert s["count"] == STEPS and s["count_per_step"] == 1.0
            assert (s["first_step"], s["last_step"]) == (0, STEPS - 1)
            assert s["blocked_us"] > 0

    expected = [s for s in sites if s["classification"] == "expected"]
    assert [(s["path"], s["function"], s["op"]) for s in expected] == [
        ("vllm/v1/worker/cpu_model_runner.py", "_to_list", "tolist")
    ]
    assert expected[0]["phase"] == "sampling" and expected[0]["count"] == STEPS

    project = ("sidecar/", "sidecar_vllm/", "plugins/")
    assert not [s for s in sites if s["path"].startswith(project) or "/sidecar/" in s["file"]]
