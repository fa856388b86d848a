"""The findings in words: what a person should take from a summary, most telling first, each sentence
built from the summary's own figures (written as the text report writes them). Plain text: the page
escapes each sentence."""

from __future__ import annotations

from statistics import median

from ..stacks.capture_section import headline as stacks_headline
from ..analysis.summary import engine_step_rows, unique_short_names
from .markup import duration, percent

# What each gap cause means (docs/analysis.md, "Idle gaps"), said for a person.
CAUSE_WORDS = {
    "sync": "a synchronising call that held the host while the GPU ran dry",
    "memcpy": "copies running instead of kernels",
    "launch": "launch latency: the next kernel's launch had begun but had not reached the GPU",
    "host": "the host busy elsewhere before it launched the next kernel",
    "unknown": "work with no launch record",
}


def findings(summary: dict) -> list[str]:
    out: list[str] = []
    for part in (_gpu, _steps, _phases, _gaps, _syncs, _collectives, _launches, _copies, _python):
        out.extend(part(summary))
    return out


def _gpu(s: dict) -> list[str]:
    gpu = s["gpu"]
    if not gpu["kernel_count"]:
        ops = s["cpu"]["top_ops"]
        top = f" The op with the most self time is {ops[0]['name']} ({duration(ops[0]['self_us'])})." if ops else ""
        return ["No GPU kernels were recorded (a CPU-only trace, or GPU activity was not recorded): "
                f"the CPU ops are the whole story.{top}"]
    out = [f"The GPU was busy {percent(gpu['busy_fraction'])} of the captured time "
           f"({duration(gpu['busy_us'])} of {duration(gpu['span_us'])}), idle {duration(gpu['idle_us'])}."]
    devices = gpu["devices"]
    if len(devices) > 1:
        low = min(devices, key=lambda d: d["busy_fraction"])
        high = max(devices, key=lambda d: d["busy_fraction"])
        out.append(f"Across {len(devices)} devices busy ranges from {percent(low['busy_fraction'])} "
                   f"(device {low['device']}) to {percent(high['busy_fraction'])} (device {high['device']}).")
    kernels = gpu["top_kernels"]
    names = unique_short_names([k["name"] for k in kernels], 70)
    top = kernels[0]
    sentence = (f"The top kernel, {names[top['name']]}, takes {percent(top['fraction'])} of kernel time "
                f"({top['count']:,} runs, mean {duration(top['mean_us'])}).")
    if len(kernels) >= 3:
        sentence += f" The top three take {percent(sum(k['fraction'] for k in kernels[:3]))}."
    out.append(sentence)
    return out


def _steps(s: dict) -> list[str]:
    if not s["steps"]:
        return []
    count, rows = engine_step_rows(s["steps"])
    whole = [r for r in rows if not r.get("partial")]
    cut = len(rows) - len(whole)
    text = f"{count} engine step{'s' if count != 1 else ''} recorded"
    if cut:
        text += f" ({cut} cut off where recording stopped, left out of the figures)"
    if len(whole) >= 2:
        mid = median(r["wall_us"] for r in whole)
        slow = max(whole, key=lambda r: r["wall_us"])
        whose = f" of {slow['process']}" if len({r["process"] for r in whole}) > 1 else ""
        text += f"; median {duration(mid)}; the slowest, step {slow['step']}{whose}, took {duration(slow['wall_us'])}"
        if mid > 0 and slow["wall_us"] >= 1.5 * mid:
            text += f" ({slow['wall_us'] / mid:.1f}× the median)"
    elif whole:
        text += f"; the complete one took {duration(whole[0]['wall_us'])}"
    return [text + "."]


def _phases(s: dict) -> list[str]:
    largest = (s.get("anatomy") or {}).get("largest")
    if not largest:
        return []
    return [f"The largest phase of a step is {largest['label']}: {duration(largest['mean_us'])} per complete step "
            f"in {largest['process']} (the step anatomy below has every phase)."]


def _gaps(s: dict) -> list[str]:
    gaps = s["gaps"]
    if not gaps["count"]:
        return []
    causes = sorted(((c, v) for c, v in gaps["by_cause"].items() if v["count"]), key=lambda cv: -cv[1]["total_us"])
    cause, figures = causes[0]
    share = figures["total_us"] / gaps["total_us"] if gaps["total_us"] else 0.0
    out = [f"The GPU sat idle in {gaps['count']:,} gaps of at least {gaps['min_gap_us']:g} µs, "
           f"{duration(gaps['total_us'])} in all; {percent(share)} of it was {CAUSE_WORDS.get(cause, cause)} "
           f"({cause})."]
    if gaps["largest"]:
        g = gaps["largest"][0]
        where = f" in step {g['step']}" if g.get("step") is not None else ""
        out.append(f"The longest gap, {duration(g['dur_us'])}{where} on device {g['device']}: "
                   f"{g['detail'] or CAUSE_WORDS.get(g['cause'], g['cause'])}.")
    return out


def _syncs(s: dict) -> list[str]:
    syncs = s["syncs"]
    if not syncs:
        return ["No synchronising calls: the host never waited for the GPU."]
    total = sum(x["count"] for x in syncs)
    blocked = sum(x["total_us"] for x in syncs)
    idle = sum(x["gpu_idle_after_us"] for x in syncs)
    top = syncs[0]
    site = top["sites"][0] if top["sites"] else None
    where = ""
    if site:
        where = f", mostly in {site['python'] or site['site'] or 'no recorded op'}"
    text = (f"{total:,} synchronising call{'s' if total != 1 else ''} blocked the host {duration(blocked)} "
            f"and left the GPU idle {duration(idle)}; the costliest is {top['name']} ({top['kind']}, "
            f"{top['count']:,}×, {duration(top['total_us'])}{where}).")
    dtoh = sum(x["after_dtoh_copy"] for x in syncs)
    if dtoh:
        text += f" {dtoh:,} came right after a device-to-host copy (the .item() / .cpu() pattern)."
    return [text]


def _collectives(s: dict) -> list[str]:
    c = s["collectives"]
    if not c["count"]:
        return []
    return [f"Collectives (NCCL/RCCL): {c['count']:,} kernels, {duration(c['time_us'])}; "
            f"{percent(c['overlap_fraction'])} overlapped with compute, {duration(c['exposed_us'])} exposed."]


def _launches(s: dict) -> list[str]:
    launches = s["launches"]
    if not launches["count"]:
        return []
    return [f"{launches['count']:,} kernel launches cost {duration(launches['total_us'])} of CPU time "
            f"(mean {duration(launches['mean_us'])}, longest {duration(launches['max_us'])})."]


def _copies(s: dict) -> list[str]:
    memcpy = s["gpu"]["memcpy"]
    if not memcpy:
        return []
    parts = ", ".join(f"{d} {v['count']:,}× {duration(v['total_us'])}" for d, v in memcpy.items())
    return [f"Copies and sets on the copy engines: {parts}."]


def _python(s: dict) -> list[str]:
    line = stacks_headline(s.get("python_stacks") or {})
    return [f"Sampled Python stacks — {line}."] if line else []
