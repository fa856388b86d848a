"""Issue 10 fault injection on real vLLM: the trace dir's disk fills up.

The sidecar and the vLLM server run in a user and mount namespace of their own (``unshare``; no root
needed) where the trace dir is a small tmpfs, so the disk really fills: every ``write`` of every
process (Kineto's JSON writer in the worker, the sidecar's gzip and merge) gets ENOSPC. The test
process sees that file system through ``/proc/<pid>/root`` of the namespace's holder process.

What must hold: serving goes on (0 failed requests); a capture is refused (507) while there is no
room; a capture that fills the disk ends with a verdict that names it; no process keeps a deleted
file open (its space would never come back), nothing half-written stays; and once there is room
again, the next capture works."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from shared_stacks import SMALL_DISK_FLOOR_MB as FLOOR_MB
from sidecar.cli.client import SidecarClient, SidecarError
from sidecar.service.export.disk_space import NO_SPACE, tree_bytes

pytestmark = pytest.mark.vllm


def open_files_under(pids: list[int], folder: Path) -> list[str]:
    """Files under ``folder`` (deleted ones too) that any of ``pids`` holds open."""
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(folder)):
                found.append(f"pid {pid}: {target}")
    return found


FILLER = "filler"  # the file that takes the room, in the trace dir


@pytest.fixture
def small_disk_stack(fault_stack):
    """The fault stack (conftest.py; tests after this one use it too) and its small disk, given back
    with its room, however the test ended."""
    stack = fault_stack.use()
    yield stack, stack.disk
    (stack.disk.seen(stack.disk.folder) / FILLER).unlink(missing_ok=True)


def test_a_full_disk_is_named_leaves_nothing_behind_and_serving_goes_on(small_disk_stack, background_load):
    stack, disk = small_disk_stack
    client = SidecarClient(stack.sidecar_url)
    engine_pids = [p["pid"] for p in client.request("GET", "/processes")["processes"]]
    filler = disk.seen(disk.folder) / FILLER
    with background_load(stack, concurrency=4, duration_s=240) as load:
        time.sleep(1.5)
        # 1. No room: refused before anything is armed, with a JSON body that names the disk.
        filler.write_bytes(b"\0" * (disk.free_bytes() - (FLOOR_MB << 20) // 2))
        with pytest.raises(SidecarError) as refused:
            client.start(3)
        assert refused.value.status == 507, refused.value.body
        assert NO_SPACE in refused.value.body["message"], refused.value.body

        # 2. A little room, a capture far bigger than it: the disk fills in the middle of the export.
        filler.unlink()
        filler.write_bytes(b"\0" * (disk.free_bytes() - (3 << 20)))
        status = client.wait(client.start(200, record_shapes=True, stacks="sampled", timeout_s=300)["id"],
                             timeout=240)
        assert status["state"] in ("failed", "partial"), status
        assert NO_SPACE in status["reason"], status
        full = [p for p in status["processes"] if NO_SPACE in (p.get("error") or "")]
        assert full, status["processes"]  # the process whose write failed says so itself

        # 3. Nothing kept open, nothing half-written: the space a full disk took comes back.
        filler.unlink()
        assert open_files_under(engine_pids, disk.folder) == []
        on_disk = disk.seen(disk.folder)
        # (Each probe's marker, <root>/probes/<pid>-<random>, is empty by design and lives as long as its probe.)
        leftovers = [str(p.relative_to(on_disk)) for p in on_disk.rglob("*")
                     if p.is_file() and p.parent.name != "probes"
                     and (p.name.endswith(".tmp") or p.stat().st_size == 0 or "raw" in p.parts)]
        assert leftovers == [], leftovers
        held = disk.used_bytes() - tree_bytes(on_disk)
        assert held < 1 << 20, f"{held} bytes used on the tmpfs are held by no file: a deleted file still open?"

        # 4. Room again: the next capture works.
        again = client.wait(client.start(3)["id"], timeout=120)
        load.stop()
    result = load.join()
    assert again["state"] == "done", again
    assert len(result.results) > 8 and not result.failures, [r.error for r in result.failures][:3]
