"""Which layer is slow, on a worker whose model runs on the GPU (issue 13 part 3): the module-timing job
times each module with CUDA timing events, and a capture with ``with_modules`` files each kernel under
the module whose forward launched it. The stand-in's model (tests/fake_engine.py ``ModelOfTheFake``):
two blocks of LayerNorm -> Linear(n, 2n) -> GELU -> Linear(2n, n); the matrix products dominate."""

import pytest

STEPS = 4
MODEL = ("--model", "--size", "2048")  # each Linear a 2048 x 2048 x 4096 product: milliseconds of device time


def test_module_timing_on_the_gpu_reads_device_events_and_leaves_no_hook(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*MODEL)
        started = host.client.start_modules(STEPS)
        job = host.client.wait(started["id"], timeout=180, path="/modules/")
        assert job["state"] == "done", job
        assert job["clock"] == "cuda" and job["hooks_left"] == 0, job
        [process] = job["processes"]
        assert process["steps_recorded"] == STEPS and process["hooks_after"] == 0, process

        rows = {m["path"]: m for m in job["modules"]}
        assert rows[""]["type"] == "ModelOfTheFake" and rows[""]["calls"] == STEPS
        assert sum(m["self_share"] for m in job["modules"]) == pytest.approx(1.0, abs=2e-3)
        types = {t["type"]: t for t in job["types"]}
        assert types["Linear"]["calls"] == 4 * STEPS and types["GELU"]["calls"] == 2 * STEPS
        # Device time, not launch time: the products outweigh the norms and activations. On the host clock
        # an asynchronous launch takes microseconds whatever the product's size, and the order is noise.
        assert types["Linear"]["self_ms"] > 3 * max(types["LayerNorm"]["self_ms"], types["GELU"]["self_ms"]), types
        linear = rows["blocks.0.mlp.0"]
        assert linear["type"] == "Linear" and linear["total_ms"] > 0


def test_a_capture_with_modules_files_the_kernels_under_the_layers_that_launched_them(gpu_host):
    with gpu_host() as host:
        host.standard_engine(*MODEL)
        started = host.client.start(STEPS, with_modules=True)
        status = host.client.wait(started["id"], timeout=180)
        assert status["state"] == "done", status
        modules = host.client.summary(status["id"])["modules"]
        assert modules["events"] >= 9 * STEPS, modules  # the model, 2 blocks x (norm, Sequential, 3 layers)
        assert modules["kernel_time_us"] > 0, modules
        top = modules["by_type"][0]
        assert top["type"] == "Linear" and top["kernel_us"] > 0.5 * modules["kernel_time_us"], modules["by_type"]
        assert {row["category"] for row in modules["by_category"] if row["kernel_us"] > 0} >= {"norm", "other"}, \
            modules["by_category"]
        # The step's .sum() runs outside the model: its kernels are outside every module, and nothing else is.
        assert 0 < modules["kernel_outside_us"] < modules["kernel_time_us"], modules

