"""``make bench``: every benchmark of the project, one after another, each printing its ratios."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ("bench_hooks.py", "bench_instrument.py", "bench_ring.py", "bench_recorder_dump.py", "bench_gpu_memory.py", "bench_capture.py", "bench_capture_options.py", "bench_sampler.py",
              "bench_telemetry.py", "bench_analyze.py", "bench_syncs.py", "bench_merge.py", "bench_report.py",
              "bench_modules.py", "bench_exemplars.py", "bench_alert_chain.py", "bench_store.py", "bench_fleet.py",
              "bench_home_page.py")


def main() -> int:
    failed = []
    for name in BENCHMARKS:
        path = HERE / name
        if not path.exists():
            continue
        print(f"\n===== {name}", flush=True)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if module.main([]) != 0:
            failed.append(name)
    if failed:
        print(f"\nbenchmarks that failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
