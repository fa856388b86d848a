"""A capture is refused while the trace dir is nearly full (issue #10, defect 7): a capture on a
full disk fails late and leaves half-written files."""

from collections import namedtuple

import pytest

from sidecar.service import disk_space
from sidecar.service.params import CaptureRequest

from service_fakes import World

Usage = namedtuple("Usage", "total used free")


async def test_a_capture_is_refused_when_the_trace_dir_is_nearly_full(tmp_path, monkeypatch):
    world = World(tmp_path)
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
