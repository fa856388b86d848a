"""Independent plain-JSON counting: json.load and simple loops, no code shared with the analyser."""

from __future__ import annotations

import math
from collections import defaultdict

HOST_CATEGORIES = {"cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver"}
SYNC_NAMES = {
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize",
}
BLOCKING_COPY_NAMES = {"cudaMemcpy", "hipMemcpy", "hipMemcpyWithStream"}


def events(trace: dict, cat: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == cat]


def kernel_totals(trace: dict) -> tuple[int, float]:
    kernels = events(trace, "kernel")
    return len(kernels), sum(e["dur"] for e in kernels)


def per_name(trace: dict, only=None, hta_rounding: bool = False) -> dict[str, list]:
    """name -> [count, total]. ``hta_rounding``: HTA 0.5 rounds fractional timestamps (start up,
    end down) before it sums."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events(trace, "kernel"):
        if only is not None and not only(e):
            continue
        dur = e["dur"]
        if hta_rounding and isinstance(e["ts"], float):
            dur = math.floor(e["ts"] + e["dur"]) - math.ceil(e["ts"])
        out[e["name"]][0] += 1
        out[e["name"]][1] += dur
    return dict(out)


def stream_busy(trace: dict) -> dict[tuple[int, int], float]:
    """(device, stream) -> time covered by at least one kernel."""
    spans: dict[tuple[int, int], list] = defaultdict(list)
    for e in events(trace, "kernel"):
        spans[(e["args"]["device"], e["args"]["stream"])].append((e["ts"], e["ts"] + e["dur"]))
    out = {}
    for key, pairs in spans.items():
        pairs.sort()
        total, cur_start, cur_end = 0.0, pairs[0][0], pairs[0][1]
        for start, end in pairs[1:]:
            if start > cur_end:
                total += cur_end - cur_start
                cur_start, cur_end = start, end
            else:
                cur_end = max(cur_end, end)
        out[key] = total + cur_end - cur_start
    return out


def host_calls(trace: dict, names: set[str], leave_out: list | None = None) -> dict[str, list]:
    """Runtime calls by name -> [count, total duration], but for the events in ``leave_out``."""
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    skip = {id(e) for e in leave_out or ()}
    for e in trace["traceEvents"]:
        if id(e) in skip:
            continue
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("name") in names:
            out[e["name"]][0] += 1
            out[e["name"]][1] += e["dur"]
    return dict(out)


DEVICE_SYNC_NAMES = {"cudaDeviceSynchronize", "hipDeviceSynchronize", "cuCtxSynchronize", "cudaThreadSynchronize"}


def profiler_stop_syncs(trace: dict) -> list[dict]:
    """torch.profiler's own synchronize at stop, the plain way: per (pid, tid), the last runtime or
    driver call (by start time) when it is a device-wide synchronize that no host op, annotation
    other than a ProfilerStep, or Python frame of that thread encloses."""
    host = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") in HOST_CATEGORIES]
    last: dict[tuple, dict] = {}
    for e in host:
        if e["cat"] in ("cuda_runtime", "cuda_driver"):
            key = (e.get("pid"), e.get("tid"))
            if key not in last or e["ts"] >= last[key]["ts"]:
                last[key] = e
    out = []
    for (pid, tid), call in last.items():
        if call["name"] not in DEVICE_SYNC_NAMES:
            continue
        enclosed = any(e.get("pid") == pid and e.get("tid") == tid and e is not call
                       and e["cat"] in ("cpu_op", "user_annotation", "python_function")
                       and not str(e.get("name", "")).startswith("ProfilerStep#")
                       and e["ts"] <= call["ts"] and call["ts"] + call["dur"] <= e["ts"] + e["dur"]
                       for e in host)
        if not enclosed:
            out.append(call)
    return out


def pageable_dtoh_copies(trace: dict) -> int:
    """cudaMemcpyAsync / hipMemcpyAsync calls whose GPU copy is DtoH into pageable memory."""
    pageable = {
        e["args"]["correlation"]
        for e in events(trace, "gpu_memcpy")
        if e["name"].startswith("Memcpy DtoH") and "Pageable" in e["name"] and "correlation" in e.get("args", {})
    }
    return sum(
        1
        for e in trace["traceEvents"]
        if e.get("cat") == "cuda_runtime" and e.get("name") in ("cudaMemcpyAsync", "hipMemcpyAsync")
        and e.get("args", {}).get("correlation") in pageable
    )


def steps(trace: dict) -> list[tuple[int, float]]:
    """(n, duration) of each ProfilerStep#n on the host."""
    return sorted(
        (int(e["name"].split("#")[1]), e["dur"])
        for e in events(trace, "user_annotation")
        if e["name"].startswith("ProfilerStep#")
    )


def launched_correlations(trace: dict) -> set:
    return {
        e["args"]["correlation"]
        for e in trace["traceEvents"]
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }


def memcpy_by_direction(trace: dict) -> dict[str, list]:
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events(trace, "gpu_memcpy"):
        key = e["name"].split()[1]
        out[key][0] += 1
        out[key][1] += e["dur"]
    for e in events(trace, "gpu_memset"):
        out["Memset"][0] += 1
        out["Memset"][1] += e["dur"]
    return dict(out)
