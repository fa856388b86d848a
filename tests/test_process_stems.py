"""Per-process file stems within one capture (sidecar/service/export/process_stems.py): unique across hosts,
a process's own stem wherever it is free, never a local process's file name given to a fetched one."""

from __future__ import annotations

import socket

import msgspec

from sidecar.probe.probe import Probe
from sidecar.common.protocol import ProcessIdentity, file_name_part
from sidecar.service.export.process_stems import unique_stems


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



def test_a_fetched_files_stem_never_takes_a_probes_own_file_name():
    # A probe's raw files end in -p<probe id> (hex): the capture's stems end in a host or a number, so a
    # file fetched into a raw folder the local probes also write to never lands on one of theirs.
    procs = [(msgspec.structs.replace(worker(0, 7, "pod"), probe_id=f"{k:08d}"), k == 0) for k in range(12)]
    stems = unique_stems(procs)
    own = {identity.probe_file_stem for identity, _ in procs}
    assert len(set(stems)) == 12 and len(own) == 12 and not own & set(stems), (stems, own)
    assert procs[3][0].probe_file_stem == "worker-rank0-pid7-pod-p00000003"


def test_two_probes_of_one_role_rank_pid_and_host_name_their_files_apart(tmp_path):
    # Two containers of one pod sharing a volume: same host name, same pid, same role and rank.
    probes = [Probe("worker", 0, cuda_available=False, trace_root=tmp_path, endpoint="http://127.0.0.1:9",
                    recorder_steps=0) for _ in range(2)]
    try:
        assert probes[0].identity.file_stem == probes[1].identity.file_stem
        traces = {p.trace_root.capture_file("c1", p.identity.probe_file_stem) for p in probes}
        dumps = {p.trace_root.recorder_file(1, p.identity.probe_file_stem) for p in probes}
        assert len(traces) == 2 and len(dumps) == 2, (traces, dumps)
        host = file_name_part(socket.gethostname())
        assert all(f"-{host}-p{p.identity.probe_id}" in p.identity.probe_file_stem for p in probes)
    finally:
        for p in probes:
            p.close()
