"""A capture is refused while the trace dir is nearly full (issue #10, defect 7): a capture on a
full disk fails late and leaves half-written files."""

from collections import namedtuple

import pytest

from sidecar.service.export import disk_space
from sidecar.service.jobs.params import CaptureRequest

from service_fakes import World

Usage = namedtuple("Usage", "total used free")


async def test_a_capture_is_refused_when_the_trace_dir_is_nearly_full(tmp_path, monkeypatch):
    world = World(tmp_path, min_free_bytes=disk_space.MIN_FREE_BYTES)
    try:
        world.connect("worker", 0)
        monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda _p: Usage(1 << 30, 1 << 30, 10 << 20))
        with pytest.raises(disk_space.DiskFull) as refused:
            await world.captures.start(CaptureRequest(steps=1))
        assert disk_space.NO_SPACE in str(refused.value) and "10 MiB" in str(refused.value)
        assert world.captures.active is None and world.board.active is None
        assert not (world.trace_dir / "captures").exists() or not any((world.trace_dir / "captures").iterdir())
    finally:
        await world.close()


async def test_the_free_space_floor_is_the_one_the_sidecar_was_given(tmp_path, monkeypatch):
    """``--min-free-mb``: 10 MiB free is refused under a 16 MiB floor and accepted under an 8 MiB one."""
    monkeypatch.setattr(disk_space.shutil, "disk_usage", lambda _p: Usage(1 << 30, 1 << 30, 10 << 20))
    for floor_mb, refused in ((16, True), (8, False)):
        world = World(tmp_path / str(floor_mb), min_free_bytes=floor_mb << 20)
        try:
            world.connect("worker", 0)
            if refused:
                with pytest.raises(disk_space.DiskFull, match="at least 16 MiB"):
                    await world.captures.start(CaptureRequest(steps=1))
            else:
                assert (await world.captures.start(CaptureRequest(steps=1))).id
        finally:
            await world.close()
