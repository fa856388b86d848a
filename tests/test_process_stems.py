"""Per-process file stems within one capture (sidecar/service/process_stems.py): unique across hosts,
a process's own stem wherever it is free, never a local process's file name given to a fetched one."""

from __future__ import annotations

from sidecar.protocol import ProcessIdentity
from sidecar.service.process_stems import unique_stems


def worker(rank: int, pid: int, host: str) -> ProcessIdentity:
    return ProcessIdentity(role="worker", role_label="worker", step_driven=True, pid=pid, rank=rank, host=host)


def test_one_host_keeps_every_name():
    procs = [(worker(0, 101, "a"), True), (worker(1, 102, "a"), True)]
    assert unique_stems(procs) == ["worker-rank0-pid101", "worker-rank1-pid102"]


def test_a_remote_process_never_takes_a_local_process_name():
    # Listed first, the remote one would otherwise be fetched into the local one's raw file.
    procs = [(worker(0, 7, "gpu-node-2"), False), (worker(0, 7, "gpu-node-1"), True)]
    assert unique_stems(procs) == ["worker-rank0-pid7-gpu-node-2", "worker-rank0-pid7"]


def test_hosts_then_numbers_tell_remote_processes_apart():
    procs = [(worker(0, 7, "node/a b"), False), (worker(0, 7, "node/a b"), False), (worker(0, 7, ""), False),
             (worker(0, 7, "node/a b"), False)]
    assert unique_stems(procs) == ["worker-rank0-pid7", "worker-rank0-pid7-node_a_b", "worker-rank0-pid7-host",
                                   "worker-rank0-pid7-node_a_b-2"]
