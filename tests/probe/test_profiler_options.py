"""What the probe asks of torch.profiler (sidecar/probe/capture/profiler_options.py, make_profiler)."""

import json

import torch

from sidecar.probe.capture.profiler_options import make_profiler
from sidecar.common.protocol import CaptureSpec


def _torch_has_trace_only() -> bool:
    try:  # torch 2.13 has it; 2.11 (seen on a GPU host) refuses the argument with a TypeError
        torch._C._profiler._ExperimentalConfig(trace_only=True)
    except TypeError:
        return False
    return True


def test_a_capture_without_the_tracer_asks_for_trace_only_where_torch_has_it():
    prof = make_profiler(CaptureSpec(id="t1", steps=1, record_shapes=True), cuda_available=False)
    if _torch_has_trace_only():
        assert prof.experimental_config is not None and prof.experimental_config.trace_only
    else:  # torch's own default, and the capture still starts
        assert prof.experimental_config is None


def test_the_tracer_gets_torchs_default_config():
    prof = make_profiler(CaptureSpec(id="t2", steps=1), cuda_available=False, with_stack=True)
    assert prof.experimental_config is None or not prof.experimental_config.trace_only


def _exported(tmp_path, name, **kwargs):
    import torch.profiler as tp

    prof = tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True, profile_memory=True,
                      with_flops=True, **kwargs)
    prof.start()
    a = torch.randn(32, 64)
    (a @ torch.randn(64, 16)).relu()
    prof.stop()
    prof.export_chrome_trace(str(tmp_path / name))
    events = json.load(open(tmp_path / name))["traceEvents"]
    return sorted((e.get("name"), e.get("cat"), tuple(sorted((e.get("args") or {}).keys()))) for e in events
                  if e.get("cat") in ("cpu_op", "cpu_instant_event"))


def test_trace_only_loses_nothing_of_the_exported_trace(tmp_path):
    """The probe's profiler (shapes, memory, flops, trace_only) exports the same ops with the same
    fields as torch's default config."""
    spec = CaptureSpec(id="t3", steps=1, record_shapes=True, profile_memory=True, with_flops=True)
    config = make_profiler(spec, cuda_available=False).experimental_config
    ours = _exported(tmp_path, "ours.json", experimental_config=config)
    default = _exported(tmp_path, "default.json")
    assert ours == default
    assert ("aten::mm", "cpu_op") in {(n, c) for n, c, _ in ours}
    assert any("Input Dims" in keys for _, _, keys in ours)
    assert any(n == "[memory]" for n, _, _ in ours)


def test_a_torch_without_trace_only_gets_its_default_and_still_records(monkeypatch, tmp_path):
    """torch 2.11 refuses ``trace_only`` (a TypeError from its constructor, seen on a GPU host)."""

    def refuse(*args, **kwargs):
        raise TypeError("__init__(): incompatible constructor arguments")

    monkeypatch.setattr(torch._C._profiler, "_ExperimentalConfig", refuse)
    prof = make_profiler(CaptureSpec(id="t4", steps=1, record_shapes=True), cuda_available=False)
    assert prof.experimental_config is None
    prof.start()
    torch.randn(8, 8) @ torch.randn(8, 8)
    prof.stop()
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    assert any(e.get("name") == "aten::mm" for e in json.load(open(tmp_path / "t.json"))["traceEvents"])
