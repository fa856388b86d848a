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
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from sidecar.client import SidecarClient, SidecarError
from sidecar.service.disk_space import NO_SPACE, tree_bytes
from sidecar_vllm.devtools import VllmStack

pytestmark = pytest.mark.vllm

TMPFS_MB = 24
FLOOR_MB = 1  # the sidecar's --min-free-mb: low, so that a capture can start with little room left


class SmallDisk:
    """A process holding a user + mount namespace in which ``folder`` is a tmpfs of ``mb`` MiB."""

    def __init__(self, folder: Path, mb: int) -> None:
        for tool in ("unshare", "nsenter"):
            assert shutil.which(tool), f"{tool} (util-linux) is needed to give the test a small disk"
        folder.mkdir(parents=True)
        self.folder = folder
        self._holder = subprocess.Popen(
            ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
             f"mount -t tmpfs -o size={mb}m tmpfs '{folder}' && echo mounted && exec sleep 100000"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self._holder.stdout.readline().strip()
        if line != "mounted":
            self._holder.kill()
            raise RuntimeError(f"cannot mount a tmpfs in a user namespace here: {self._holder.stderr.read().strip()}")

    @property
    def launcher(self) -> tuple[str, ...]:
        """Runs a command inside the namespace, as the same user (uid 0 inside maps to it)."""
        return ("nsenter", "-t", str(self._holder.pid), "--user", "--mount", "--preserve-credentials", "--")

    def seen(self, path: Path) -> Path:
        """``path`` inside the namespace, as this process can reach it."""
        return Path(f"/proc/{self._holder.pid}/root") / path.relative_to("/")

    def used_bytes(self) -> int:
        st = os.statvfs(self.seen(self.folder))
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def free_bytes(self) -> int:
        st = os.statvfs(self.seen(self.folder))
        return st.f_bavail * st.f_frsize

    def close(self) -> None:
        self._holder.kill()
        self._holder.wait(timeout=10)


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


@pytest.fixture
def small_disk_stack(tiny_model, tmp_path):
    disk = SmallDisk(tmp_path / "traces", TMPFS_MB)
    stack = VllmStack(model_dir=tiny_model, work_dir=tmp_path / "stack", launcher=disk.launcher,
                      env={"SIDECAR_TRACE_DIR": str(disk.folder)}, sidecar_args=("--min-free-mb", str(FLOOR_MB)))
    try:
        stack.start()
        yield stack, disk
    finally:
        stack.close()
        disk.close()


def test_a_full_disk_is_named_leaves_nothing_behind_and_serving_goes_on(small_disk_stack, background_load):
    stack, disk = small_disk_stack
    client = SidecarClient(stack.sidecar_url)
    engine_pids = [p["pid"] for p in client.request("GET", "/processes")["processes"]]
    filler = disk.seen(disk.folder) / "filler"
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
