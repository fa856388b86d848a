"""A CUDA caching allocator snapshot made into its summary (sidecar/probe/memory_summary.py), from
snapshots in PyTorch's own format: written by hand, and produced by the allocator stand-in
(tests/fake_cuda_allocator.py) as a worker's steps allocate and free."""

from __future__ import annotations

import json

from fake_cuda_allocator import (STEP_ALLOCS, WEIGHT_BYTES, FakeAllocator, rounded, site, step_work)
from sidecar.probe.memory_summary import BEFORE, UNKNOWN, site_of, summarize

MiB = 2**20


def frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


TORCH = frame("/usr/lib/python3/site-packages/torch/_tensor.py", 40, "__add__")
USER = frame("/srv/app/model.py", 7, "forward")


def entry(action: str, addr: int, size: int, time_us: int, frames=(TORCH, USER)) -> dict:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames), "time_us": time_us}


def test_the_site_is_the_first_frame_outside_torch():
    assert site_of([TORCH, USER, frame("/srv/app/main.py", 1, "main")]) == "/srv/app/model.py:7 (forward)"
    assert site_of([TORCH, frame("??", 0, "at::empty"), frame("<frozen runpy>", 3, "run")]) == UNKNOWN
    assert site_of([]) == UNKNOWN and site_of(None) == UNKNOWN


def test_a_hand_written_snapshot():
    # Before the recording: a 4 MiB block of a 6 MiB segment, live throughout. Recorded: a new 2 MiB
    # segment, two allocations (1 MiB then 512 KiB), the first freed: the peak is 5.5 MiB with both live.
    seg_a, seg_b = 0x1000_0000, 0x2000_0000
    trace = [
        entry("segment_alloc", seg_b, 2 * MiB, 1_000_010),
        entry("alloc", seg_b, 1 * MiB, 1_000_020),
        entry("alloc", seg_a + 4 * MiB, 512 * 1024, 1_000_030, (TORCH, frame("/srv/app/cache.py", 3, "grow"))),
        entry("free_requested", seg_b, 1 * MiB, 1_000_040),
        entry("free_completed", seg_b, 1 * MiB, 1_000_050),
    ]
    snapshot = {
        "segments": [
            {"device": 0, "address": seg_a, "total_size": 6 * MiB, "blocks": [
                {"address": seg_a, "size": 4 * MiB, "state": "active_allocated", "frames": []},
                {"address": seg_a + 4 * MiB, "size": 512 * 1024, "state": "active_allocated", "frames": [USER]},
                {"address": seg_a + 4 * MiB + 512 * 1024, "size": 1536 * 1024, "state": "inactive", "frames": []}]},
            {"device": 0, "address": seg_b, "total_size": 2 * MiB, "blocks": [
                {"address": seg_b, "size": 2 * MiB, "state": "inactive", "frames": []}]},
            {"device": 1, "address": 0x3000_0000, "total_size": 64 * MiB, "blocks": []},  # another device's
        ],
        "device_traces": [trace, []],
    }
    s = summarize(snapshot, device=0, start_us=1_000_000, step_ends_us=[1_000_035, 1_000_060], max_entries=5)
    assert s["entries"] == 5 and s["truncated"] is True, "the ring was full"
    assert (s["allocations"], s["frees"], s["segment_allocs"]) == (2, 1, 1)
    assert s["start"] == {"allocated_bytes": 4 * MiB, "reserved_bytes": 6 * MiB}
    assert s["end"] == {"allocated_bytes": 4 * MiB + 512 * 1024, "reserved_bytes": 8 * MiB, "free_blocks": 2,
                        "free_bytes": 1536 * 1024 + 2 * MiB, "largest_free_block_bytes": 2 * MiB}
    peak = s["peak"]
    assert peak["allocated_bytes"] == 5 * MiB + 512 * 1024 and peak["reserved_bytes"] == 8 * MiB
    assert peak["entry"] == 2 and peak["at_ms"] == 0.03 and peak["fragmentation_bytes"] == 8 * MiB - peak["allocated_bytes"]
    assert peak["sites"] == [{"site": BEFORE, "bytes": 4 * MiB, "blocks": 0},
                             {"site": "/srv/app/model.py:7 (forward)", "bytes": 1 * MiB, "blocks": 1},
                             {"site": "/srv/app/cache.py:3 (grow)", "bytes": 512 * 1024, "blocks": 1}]
    assert s["fragmentation"] == {"bytes": 8 * MiB - (4 * MiB + 512 * 1024), "largest_free_block_bytes": 2 * MiB,
                                  "free_blocks": 2}
    first, second = s["steps"]
    assert (first["allocations"], first["frees"], first["peak_allocated_bytes"]) == (2, 0, peak["allocated_bytes"])
    assert (first["allocated_bytes"], first["reserved_bytes"]) == (5 * MiB + 512 * 1024, 8 * MiB)
    assert (second["allocations"], second["frees"], second["allocated_bytes"]) == (0, 1, 4 * MiB + 512 * 1024)
    assert s["series"][0] == [0.0, 4 * MiB, 6 * MiB] and s["series"][-1] == [0.05, 4 * MiB + 512 * 1024, 8 * MiB]
    json.dumps(s)  # plain JSON, for the probe channel


def test_a_free_of_a_block_from_before_the_recording_lowers_that_row():
    # 3 MiB live before the recording, freed in it; then 1 MiB allocated in its place, live at the end.
    snapshot = {"segments": [{"device": 0, "address": 0, "total_size": 4 * MiB, "blocks": [
        {"address": 0, "size": 1 * MiB, "state": "active_allocated", "frames": [USER]},
        {"address": MiB, "size": 3 * MiB, "state": "inactive", "frames": []}]}],
        "device_traces": [[entry("free_completed", 0, 3 * MiB, 10), entry("alloc", 0, 1 * MiB, 20)]]}
    s = summarize(snapshot, start_us=0)
    assert s["start"]["allocated_bytes"] == 3 * MiB, "the block freed, and the one allocated, both undone"
    assert s["peak"]["allocated_bytes"] == 3 * MiB and s["peak"]["entry"] == -1
    assert s["peak"]["sites"] == [{"site": BEFORE, "bytes": 3 * MiB, "blocks": 0}]
    assert s["steps"] == [] and s["truncated"] is False


def test_the_stand_ins_steps_give_the_figures_it_allocated():
    clock = iter(range(1_000, 10**9, 10))
    allocator = FakeAllocator(clock_us=lambda: next(clock))
    allocator.alloc(WEIGHT_BYTES, 5, "load_weights")
    step_work(allocator)  # a step before the recording: the segments exist already
    allocator.start(100_000)
    start = next(clock)
    ends = []
    for _ in range(4):
        step_work(allocator)
        ends.append(next(clock))
    s = summarize(allocator.snapshot(), step_ends_us=ends, start_us=start, max_entries=100_000)
    allocator.stop()
    step_bytes = sum(rounded(size) for size, _, _ in STEP_ALLOCS)
    assert s["allocations"] == s["frees"] == 4 * len(STEP_ALLOCS) and s["segment_allocs"] == 0
    assert s["entries"] == 4 * 3 * len(STEP_ALLOCS)  # alloc, free_requested, free_completed each
    assert s["peak"]["allocated_bytes"] == WEIGHT_BYTES + step_bytes == allocator.allocated() + step_bytes
    assert s["end"]["reserved_bytes"] == allocator.reserved() == s["start"]["reserved_bytes"]
    assert s["end"]["allocated_bytes"] == s["start"]["allocated_bytes"] == WEIGHT_BYTES
    by_site = {r["site"]: r for r in s["peak"]["sites"]}
    assert by_site[BEFORE]["bytes"] == WEIGHT_BYTES
    for size, line, name in STEP_ALLOCS:
        assert by_site[site(line, name)] == {"site": site(line, name), "bytes": rounded(size), "blocks": 1}
    assert [r["allocations"] for r in s["steps"]] == [len(STEP_ALLOCS)] * 4
    assert all(r["peak_allocated_bytes"] == WEIGHT_BYTES + step_bytes for r in s["steps"])
    assert s["fragmentation"]["bytes"] == allocator.reserved() - WEIGHT_BYTES
    assert s["fragmentation"]["largest_free_block_bytes"] == 3 * 2**20  # the mlp's segment, free again


def test_every_list_is_bounded():
    allocator = FakeAllocator()
    allocator.start(100_000)
    for i in range(600):  # 600 sites live at once, 600 entries of series
        allocator.alloc(4096, line=i, name=f"f{i}")
    s = summarize(allocator.snapshot(), top=20, max_points=50)
    assert len(s["series"]) == 50 and s["series"][-1][1] == s["peak"]["allocated_bytes"], "the peak is kept"
    assert len(s["peak"]["sites"]) == 21 and s["peak"]["sites"][-1]["site"] == "(580 other sites)"
    assert sum(r["bytes"] for r in s["peak"]["sites"]) == 600 * 4096
    assert len(json.dumps(s)) < 20_000


def test_the_page_escapes_every_text_of_the_engine():
    from sidecar.report.memory_page import render_memory_page

    hostile = "<script>alert(1)</script>"
    allocator = FakeAllocator()
    allocator.start(1000)
    allocator.alloc(4096, line=1, name=hostile)
    s = summarize(allocator.snapshot(), step_ends_us=[10**18], start_us=0)
    s["raw_file"] = {"kept": False, "bytes": 0, "note": hostile}
    job = {"id": "g20261128-000000-abcdef", "state": "done", "reason": hostile, "steps": 1, "max_entries": 1000,
           "created_at": 0, "notes": [hostile], "processes": [
               {"label": hostile, "state": "done", "summary": s, "download": None},
               {"label": "worker rank 1 (pid 2)", "state": "failed", "error": hostile, "summary": None}]}
    html = render_memory_page(job)
    assert "<script>" not in html.split("</head>", 1)[1] and html.count("&lt;script&gt;") >= 5
    assert "script-src &#x27;none&#x27;" in html and "(&lt;script&gt;alert(1)&lt;/script&gt;)" in html
