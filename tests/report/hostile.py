"""A small GPU trace whose kernel, op and process names are markup: what a page must show as text."""

from __future__ import annotations

import json
from pathlib import Path

KERNEL = '<script>window.__pwned = "kernel"</script>bad_kernel'
OP = '<img src=x onerror="window.__pwned = \'op\'">aten::evil'
PROCESS = '</title><script>window.__pwned = "process"</script>'
MARKERS = ("<script>window.__pwned", "<img src=x", "</title><script>")


def write_trace(path: Path, steps: int = 3) -> Path:
    pid, tid, events, corr = 100, 100, [], 0
    events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": PROCESS}})
    for n in range(steps):
        base = n * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n + 1}", "pid": pid, "tid": tid,
                       "ts": base, "dur": 900, "args": {}})
        for i, name in enumerate((KERNEL, "plain_kernel")):
            corr += 1
            start = base + 10 + i * 300
            events.append({"ph": "X", "cat": "cpu_op", "name": OP, "pid": pid, "tid": tid, "ts": start, "dur": 50,
                           "args": {}})
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                           "ts": start + 5, "dur": 20, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start + 40,
                           "dur": 150, "args": {"device": 0, "stream": 7, "correlation": corr}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": pid, "tid": tid,
                       "ts": base + 700, "dur": 30, "args": {}})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}), encoding="utf-8")
    return path
