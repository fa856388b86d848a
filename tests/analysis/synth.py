"""Hand-built Kineto-style traces for cases the recorded ones do not cover exactly."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

PID, TID, DEVICE, STREAM = 100, 100, 0, 7


def op(name, ts, dur, cat="cpu_op", pid=PID, tid=TID):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def step(n, ts, dur, pid=PID, tid=TID):
    return op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation", pid=pid, tid=tid)


def runtime(name, ts, dur, corr, pid=PID, tid=TID):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def kernel(name, ts, dur, corr, device=DEVICE, stream=STREAM, cat="kernel", pid=None):
    return {
        "ph": "X", "cat": cat, "name": name, "pid": device if pid is None else pid, "tid": stream, "ts": ts, "dur": dur,
        "args": {"device": device, "stream": stream, "correlation": corr},
    }


def process_name(pid, name):
    return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}}


def write(path: Path, events: list, **top) -> Path:
    body = {"schemaVersion": 1, **top, "traceEvents": events}
    text = json.dumps(body)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path
