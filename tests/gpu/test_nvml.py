"""NVML readings from a real GPU, pushed by an engine process's telemetry to the sidecar and served on its
/metrics as Prometheus reads them."""

import time


def _gauges(text: str, name: str) -> list[tuple[str, float]]:
    return [(line.split("{", 1)[1].rsplit("}", 1)[0], float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines() if line.startswith(name + "{")]


def test_gpu_metrics_reach_the_sidecars_prometheus_endpoint(gpu_host):
    fast = {"SIDECAR_METRICS_PUSH_INTERVAL_MS": "500", "SIDECAR_SAMPLE_INTERVAL_S": "0.5"}
    with gpu_host() as host:
        host.standard_engine("--planted-sync", "--telemetry", **fast)
        deadline = time.monotonic() + 60
        while True:
            text = host.client.get_bytes("/metrics").decode()
            utilization = _gauges(text, "hw_gpu_utilization")
            if utilization and max(v for _, v in utilization) > 0:
                break
            assert time.monotonic() < deadline, [l for l in text.splitlines() if l.startswith("hw_")]
            time.sleep(0.5)
        labels, used = _gauges(text, "hw_gpu_memory_usage_bytes")[0]
        assert 'hw_name="NVIDIA' in labels and 'gpu_index="0"' in labels, labels
        assert used > 256 << 20, "the worker holds a CUDA context and its 4096^2 matrices"
        [(_, limit)] = _gauges(text, "hw_gpu_memory_limit_bytes")
        assert limit > used
        assert 0 < max(v for _, v in utilization) <= 1.0
        assert [v for _, v in _gauges(text, "hw_temperature_celsius")] and [v for _, v in _gauges(text, "hw_power_watts")]
