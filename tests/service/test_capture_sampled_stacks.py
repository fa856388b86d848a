"""Sampled Python stacks through the capture's life cycle in the sidecar: a probe reports its raw
samples file with its ``done``; the export builds the slices and the summary (the capture's
``stack_summary``, notes); a corrupt samples file ends the capture with its trace and a note; a
cancelled capture deletes the samples with the raw trace; a probe that could not save its samples
says why in its report."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import msgspec
import pytest

from sidecar.common.protocol import Begin, Stop
from sidecar.stacks.sampler import StackSampler
from sidecar.service.jobs.params import CaptureRequest
from sidecar.stacks.samples_file import encode, samples_path

from service_fakes import World, sent, until


@pytest.fixture
async def world(tmp_path):
    w = World(tmp_path)
    yield w
    await w.close()


def planted_hot_loop(stop: threading.Event) -> None:
    while not stop.is_set():
        time.sleep(0.0005)


def real_samples(pid: int) -> bytes:
    """A real sampler's dump of a thread sitting in ``planted_hot_loop``, as process ``pid``'s."""
    stop = threading.Event()
    thread = threading.Thread(target=planted_hot_loop, args=(stop,), daemon=True)
    thread.start()
    sampler = StackSampler(thread.ident)
    try:
        sampler.start()
        time.sleep(0.05)
        raw = sampler.raw()
    finally:
        stop.set()
        thread.join(5)
        sampler.close()
    return encode(msgspec.structs.replace(raw, pid=pid))


def write_raw(tmp_path: Path, capture_id: str, conn, samples: bytes | None) -> tuple[Path, Path]:
    """What a probe leaves under its own trace root: its trace and, with sampled stacks, its samples."""
    raw = tmp_path / "probe-root" / "captures" / capture_id / "raw" / f"{conn.identity.file_stem}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    pid = conn.identity.pid
    raw.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": time.time_ns() - 10**9, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": pid, "tid": 1, "ts": 10.0, "dur": 5.0}]}))
    stacks = Path(samples_path(str(raw)))
    if samples is not None:
        stacks.write_bytes(samples)
    return raw, stacks


async def record(world: World, samples: bytes | None, tmp_path: Path, **report):
    core = world.connect("engine_core")
    capture = await world.captures.start(CaptureRequest(steps=1, stacks="sampled"))
    await world.capture_report(core, capture.id, "armed", steps_seen=1)
    await until(lambda: sent(core, Begin))
    await world.capture_report(core, capture.id, "capturing", first_step=capture.start_step)
    await world.capture_report(core, capture.id, "exporting", steps_recorded=1, first_step=capture.start_step)
    raw, stacks = write_raw(tmp_path, capture.id, core, samples if samples != b"real" else real_samples(core.identity.pid))
    fields = {"stacks_file": str(stacks), **report}
    await world.capture_report(core, capture.id, "done", steps_recorded=1, first_step=capture.start_step,
                               file=str(raw), bytes=raw.stat().st_size, stacks="sampled", **fields)
    await capture.done_event.wait()
    return capture, raw, stacks


async def test_the_export_builds_the_stack_summary_and_the_slices(world, tmp_path):
    capture, raw, stacks = await record(world, b"real", tmp_path)
    assert capture.state == "done", capture.reason
    [rec] = capture.processes
    assert rec.stacks == "sampled" and rec.stack_summary["samples"] > 0 and rec.stack_summary["stop_reason"] is None
    assert any(row["function"] == "planted_hot_loop" for row in rec.stack_summary["top_total"])
    summary = json.loads((capture.dir / capture.summary_file).read_text())
    assert summary["python_stacks"][rec.label]["samples"] == rec.stack_summary["samples"]
    assert "python: " in capture.headline and capture.notes == []
    assert not raw.exists() and not stacks.exists() and not raw.parent.parent.exists()


@pytest.mark.parametrize("samples, why", [(b"\x93not a samples file", "unreadable"), (None, "missing")])
async def test_a_corrupt_or_missing_samples_file_ends_done_with_the_trace_and_a_note(world, tmp_path, samples, why):
    capture, raw, stacks = await record(world, samples, tmp_path)
    assert capture.state == "done" and capture.trace_file == "trace.json.gz", capture.reason
    [rec] = capture.processes
    assert rec.file and rec.state == "done"
    assert rec.stack_summary["samples"] == 0 and why in rec.stack_summary["error"]
    assert any(n.startswith(f"{rec.label}: python stacks lost: samples file {why}") and n.endswith("the trace was kept")
               for n in capture.notes), capture.notes
    assert not raw.exists() and not stacks.exists()


async def test_a_probe_that_could_not_save_its_samples_says_so_in_a_note(world, tmp_path):
    error = "python stacks not saved: no space left on device (/x)"
    capture, _raw, _stacks = await record(world, None, tmp_path, stacks_file=None,
                                          stack_summary={"samples": 12, "error": error})
    assert capture.state == "done"
    [rec] = capture.processes
    assert rec.stack_summary == {"samples": 12, "error": error}
    assert f"{rec.label}: {error}; the trace was kept" in capture.notes


async def test_a_cancelled_capture_deletes_the_samples_with_the_raw_trace(world, tmp_path):
    world.connect("engine_core")
    api = world.connect("api_server")
    capture = await world.captures.start(CaptureRequest(steps=3, stacks="sampled"))
    await world.capture_report(api, capture.id, "armed")
    await world.capture_report(api, capture.id, "capturing")
    raw, stacks = write_raw(tmp_path, capture.id, api, real_samples(api.identity.pid))
    stopping = asyncio.create_task(world.captures.stop("stopped by request"))  # answers once cancelled
    await until(lambda: sent(api, Stop))
    await world.capture_report(api, capture.id, "exporting")
    await world.capture_report(api, capture.id, "done", file=str(raw), bytes=raw.stat().st_size, stacks="sampled",
                               stacks_file=str(stacks))
    await stopping
    assert capture.state == "cancelled"
    assert not raw.exists() and not stacks.exists()


def test_an_interrupted_captures_samples_go_with_its_leftovers(tmp_path):
    from sidecar.service.jobs.capture_index import restore_captures

    folder = tmp_path / "traces" / "captures" / "20260101-000000-abcdef"
    (folder / "raw").mkdir(parents=True)
    (folder / "raw" / "worker-rank0-pid7.json").write_text('{"traceEvents": [')
    (folder / "raw" / "worker-rank0-pid7.stacks.msgpack").write_bytes(b"\x8f")
    [capture] = restore_captures(tmp_path / "traces")
    assert capture.state == "failed" and not (folder / "raw").exists()
