import logging
import os
import time

import psutil
import pynvml

from sidecar.telemetry.gpu import GpuSampler
from sidecar.telemetry.steps import step_sampled

from .helpers import in_memory_telemetry, metric_points


def test_step_sampling_is_even_and_exact():
    for ratio in (0.0, 0.01, 0.1, 0.25, 1 / 3, 0.5, 1.0):
        picked = [i for i in range(3000) if step_sampled(i, ratio)]
        assert len(picked) == round(3000 * ratio)
        if len(picked) > 1:
            gaps = {b - a for a, b in zip(picked, picked[1:])}
            assert max(gaps) - min(gaps) <= 1


def test_step_recorder_metrics_and_sampled_spans():
    telemetry, exporter, reader = in_memory_telemetry(step_spans_ratio=0.1)
    recorder = telemetry.step_recorder("worker")
    now = time.time_ns()
    for i in range(50):
        recorder.observe(now + i * 2_000_000, now + i * 2_000_000 + 1_500_000, batch_size=4, tokens=4)
    telemetry.run_tasks_once()
    [duration] = metric_points(reader, "sidecar.step.duration")
    assert duration.count == 50 and abs(duration.sum - 50 * 0.0015) < 1e-9
    assert duration.attributes["sidecar.process.role"] == "worker"
    [batch] = metric_points(reader, "sidecar.step.batch_size")
    assert batch.sum == 200
    telemetry.span_processor.force_flush()
    spans = [s for s in exporter.get_finished_spans() if s.name == "worker step"]
    assert len(spans) == 5
    assert all(s.end_time - s.start_time == 1_500_000 for s in spans)
    assert recorder.dropped == 0


def test_step_spans_are_off_by_default():
    telemetry, exporter, reader = in_memory_telemetry()
    recorder = telemetry.step_recorder("engine_core")
    recorder.observe(1, 2, 1, 1)
    telemetry.run_tasks_once()
    telemetry.span_processor.force_flush()
    assert exporter.get_finished_spans() == ()
    assert metric_points(reader, "sidecar.step.duration")[0].count == 1


def test_process_sampler_reports_cpu_and_rss():
    telemetry, _, reader = in_memory_telemetry()
    telemetry.start_samplers(process=True, gpu=False)
    sum(i * i for i in range(200_000))  # some CPU time
    telemetry.run_tasks_once()
    rss = metric_points(reader, "process.memory.usage")[0].value
    assert abs(rss - psutil.Process(os.getpid()).memory_info().rss) < 64 << 20
    cpu = {p.attributes["cpu.mode"]: p.value for p in metric_points(reader, "process.cpu.time")}
    assert cpu["user"] > 0
    telemetry.shutdown()


def test_no_gpu_driver_means_one_log_line_and_no_gpu_metrics(caplog):
    try:  # this test is about machines without an NVIDIA driver; it says so if run on one with a driver
        pynvml.nvmlInit()
        has_driver = True
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        has_driver = False
    assert not has_driver, "this machine has an NVIDIA driver: run the GPU check in docs/telemetry.md instead"
    telemetry, _, reader = in_memory_telemetry()
    with caplog.at_level(logging.INFO, logger="sidecar.telemetry.gpu"):
        telemetry.start_samplers(process=False, gpu=True)
        for _ in range(3):
            telemetry.run_tasks_once()
    gpu_logs = [r for r in caplog.records if r.name == "sidecar.telemetry.gpu"]
    assert len(gpu_logs) == 1 and "GPU metrics are off" in gpu_logs[0].getMessage()
    assert metric_points(reader, "hw.gpu.utilization") == []
    assert GpuSampler.create(telemetry.meter) is None
    telemetry.shutdown()
