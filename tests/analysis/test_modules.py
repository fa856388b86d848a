"""Time per nn.Module (issue 13 part 3): torch.profiler's module hierarchy, recorded by the probe's own
recorder around a real Llama forward, read back by the analysis; kernels found their module through
the launch that started them; traces without module ranges say so."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from sidecar.analysis import analyze_path, format_report
from sidecar.analysis.questions.modules import ABSENT_NOTE, CATEGORIES, category_of, type_of
from sidecar.engine import ENGINE_CORE, WORKER
from sidecar.probe.capture.profiler_options import module_mode, stack_mode
from sidecar.probe.capture.profiler import StepCapture
from sidecar.common.protocol import CaptureSpec

from . import synth
from .conftest import TRACE_NAMES, trace_path


@pytest.fixture(scope="module")
def llama(tiny_model):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()  # the session's model
    return model, model.config.num_hidden_layers


def record(model, tmp_path, spec: CaptureSpec, role) -> tuple[str, object]:
    """Two forward steps recorded by the probe's StepCapture, as the worker's probe does."""
    done = threading.Event()
    reports = []

    def report(msg):
        reports.append(msg)
        if msg.state in ("done", "failed"):
            done.set()

    path = tmp_path / "worker.json"
    with ThreadPoolExecutor(1) as exporter:
        capture = StepCapture(spec, str(path), report, exporter, stacks=stack_mode(spec, role))
        capture.begin(0)
        ids = torch.randint(0, model.config.vocab_size, (2, 12))
        with torch.no_grad():
            for i in range(2):
                capture.on_step_begin(True, i)
                model(ids)
                capture.on_step_end(True)
        assert done.wait(60)
    assert reports[-1].state == "done", reports[-1]
    return str(path), reports[-1]


@pytest.fixture(scope="module")
def llama_capture(llama, tmp_path_factory):
    model, layers = llama
    path, report = record(model, tmp_path_factory.mktemp("cap"), CaptureSpec(id="m1", steps=2, with_modules=True), WORKER)
    return path, report, layers


def test_only_the_role_that_runs_the_model_records_modules_and_its_stacks_say_traced():
    spec = CaptureSpec(id="m1", steps=2, with_modules=True)
    assert module_mode(spec, WORKER) and stack_mode(spec, WORKER) == "traced"
    assert not module_mode(spec, ENGINE_CORE) and stack_mode(spec, ENGINE_CORE) == "none"
    plain = CaptureSpec(id="m2", steps=2)
    assert not module_mode(plain, WORKER) and stack_mode(plain, WORKER) == "none"


def test_the_capture_holds_a_module_range_per_layer_call(llama_capture):
    path, report, layers = llama_capture
    assert report.stacks == "traced"
    names = [e["name"] for e in json.load(open(path))["traceEvents"] if str(e.get("name", "")).startswith("nn.Module: ")]
    decoder = sorted({n for n in names if "DecoderLayer" in n})
    assert decoder == [f"nn.Module: LlamaDecoderLayer_{i}" for i in range(layers)]
    assert names.count("nn.Module: LlamaDecoderLayer_0") == 2  # one per recorded step


def test_a_capture_without_with_modules_has_no_module_ranges_and_the_summary_says_so(llama, tmp_path):
    path, _ = record(llama[0], tmp_path, CaptureSpec(id="m3", steps=2), WORKER)
    modules = analyze_path(path)["modules"]
    assert modules["events"] == 0 and modules["note"] == ABSENT_NOTE
    assert modules["by_category"] == modules["by_type"] == modules["top_modules"] == []
    assert "Modules: no nn.Module ranges" in format_report(analyze_path(path))


def test_time_per_kind_of_layer_adds_up_to_the_time_in_modules(llama_capture):
    path, _, layers = llama_capture
    summary = analyze_path(path)
    modules = summary["modules"]
    assert modules == summary["processes"][0]["modules"]  # one process: the same figures
    rows = {r["category"]: r for r in modules["by_category"]}
    assert list(rows) == list(CATEGORIES)
    for kind in ("attention", "mlp", "norm", "embedding"):
        assert rows[kind]["calls"] > 0 and rows[kind]["self_us"] > 0, kind
    # Self times share the top-level modules' time out: nothing counted twice, nothing lost.
    assert sum(r["self_us"] for r in rows.values()) == pytest.approx(modules["total_us"], rel=1e-6)
    assert sum(r["fraction"] for r in rows.values()) == pytest.approx(1.0, abs=1e-3)
    assert modules["total_us"] >= max(r["total_us"] for r in modules["top_modules"])
    types = {r["type"]: r for r in analyze_path(path, top_n=100)["modules"]["by_type"]}
    assert types["LlamaDecoderLayer"]["calls"] == 2 * layers
    assert types["LlamaAttention"]["category"] == "attention" and types["LlamaMLP"]["category"] == "mlp"
    assert types["LlamaRMSNorm"]["category"] == "norm"
    # A Linear counts in the layer it runs in: attention (q/k/v/o), the MLP (gate/up/down), and "other" for
    # transformers' LM head, a plain Linear right under the model (the ranges name classes, not attributes;
    # vLLM's is a ParallelLMHead and a LogitsProcessor: sampler).
    assert types["Linear"]["category"] == "attention+mlp+other"


def test_module_paths_name_each_layer_from_the_outermost_module(llama_capture):
    path, _, layers = llama_capture
    modules = analyze_path(path, top_n=1000)["modules"]
    paths = {r["path"] for r in modules["top_modules"]}
    for i in range(layers):
        assert f"LlamaForCausalLM_0/LlamaModel_0/LlamaDecoderLayer_{i}/LlamaAttention_{i}" in paths
    report = format_report(analyze_path(path))
    assert "by kind of layer:" in report and "LlamaDecoderLayer" in report


def test_kernels_find_their_module_through_their_launch(tmp_path):
    """A hand-built GPU trace (the shared GPU traces hold no module ranges): a kernel counts in the
    innermost module around its launch call; one launched outside every module counts outside."""
    m = lambda name, ts, dur: synth.op(f"nn.Module: {name}", ts, dur, cat="python_function")  # noqa: E731
    events = [
        synth.step(0, 0, 1000),
        m("Model_0", 10, 500),
        m("Attention_0", 20, 200),
        m("Linear_0", 30, 50),
        synth.op("aten::mm", 35, 30),
        synth.runtime("cudaLaunchKernel", 40, 5, corr=1),
        synth.runtime("cudaLaunchKernel", 100, 5, corr=2),  # in Attention_0, outside Linear_0
        m("MLP_0", 250, 200),
        synth.runtime("cudaLaunchKernel", 260, 5, corr=3),
        synth.runtime("cudaLaunchKernel", 700, 5, corr=4),  # after the model: outside every module
        synth.kernel("gemm", 50, 40, corr=1),
        synth.kernel("softmax", 110, 10, corr=2),
        synth.kernel("mlp_gemm", 270, 100, corr=3),
        synth.kernel("argmax", 710, 7, corr=4),
    ]
    path = synth.write(tmp_path / "gpu.json", events)
    modules = analyze_path(path, top_n=100)["modules"]
    assert modules["kernel_time_us"] == pytest.approx(150) and modules["kernel_outside_us"] == pytest.approx(7)
    kinds = {r["category"]: r for r in modules["by_category"]}
    assert kinds["attention"]["kernel_us"] == pytest.approx(50) and kinds["mlp"]["kernel_us"] == pytest.approx(100)
    assert kinds["mlp"]["kernel_fraction"] == pytest.approx(100 / 150, abs=1e-4)
    paths = {r["path"]: r for r in modules["top_modules"]}
    assert paths["Model_0/Attention_0/Linear_0"]["kernel_us"] == pytest.approx(40)
    assert paths["Model_0/Attention_0"]["kernel_us"] == pytest.approx(10)
    assert modules["top_modules"][0]["path"] == "Model_0/MLP_0"  # ranked by device time on a GPU trace
    assert "of kernels inside" in format_report(analyze_path(path))


@pytest.mark.parametrize("name", TRACE_NAMES)
def test_the_shared_gpu_traces_hold_no_module_ranges_and_nothing_is_invented(name, summary_of):
    modules = summary_of(name, top_n=10)["modules"]
    assert modules["events"] == 0 and modules["by_type"] == [] and modules["note"] == ABSENT_NOTE
    assert modules["kernel_time_us"] == 0
    assert modules["kernel_outside_us"] == pytest.approx(summary_of(name, top_n=10)["gpu"]["kernel_time_us"], abs=0.01)


@pytest.mark.parametrize("type_name, kind", [
    ("LlamaAttention", "attention"), ("Qwen2Attention", "attention"), ("RotaryEmbedding", "attention"),
    ("LlamaMLP", "mlp"), ("FusedMoE", "mlp"), ("RMSNorm", "norm"), ("LayerNorm", "norm"),
    ("VocabParallelEmbedding", "embedding"), ("ParallelLMHead", "sampler"), ("LogitsProcessor", "sampler"),
    ("Sampler", "sampler"), ("Linear", None), ("LlamaDecoderLayer", None),
])
def test_the_kind_of_layer_comes_from_the_class_name_or_is_inherited(type_name, kind):
    assert category_of(type_name) == kind
    assert type_of(f"{type_name}_12") == type_name
