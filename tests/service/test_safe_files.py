"""safe_files.py (issue 27): the names a restored capture.json may give are exactly the names the
sidecar writes, whatever hosts, roles, ranks and pids made them, and a file is opened only if it is
a regular file of its folder itself, never through a link."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from sidecar.common.protocol import ROLE_PATTERN, ProcessIdentity
from sidecar.service.export.merge import MERGED_NAME, PROCESS_TRACE_SUFFIX, SUMMARY_NAME
from sidecar.service.export.process_stems import unique_stems
from sidecar.service.export.safe_files import (
    NotInFolder, is_capture_file_name, is_process_file_name, open_capture_file, open_in_folder,
)

# Small pools as well as wide ones, so that stems collide and unique_stems appends hosts and numbers.
roles = st.sampled_from(["worker", "engine_core"]) | st.from_regex(ROLE_PATTERN, fullmatch=True)
ranks = st.none() | st.sampled_from([0, 1]) | st.integers(0, 10**6)
pids = st.sampled_from([1, 7]) | st.integers(1, 2**31)
hosts = (st.sampled_from(["", "pod", "pod", "../..", "a/b", "node-2.example.", "-", "._", "x" * 80])
         | st.text(max_size=80))
processes = st.lists(st.tuples(
    st.builds(lambda role, rank, pid, host: ProcessIdentity(role=role, role_label="r", step_driven=True, pid=pid,
                                                            rank=rank, host=host), roles, ranks, pids, hosts),
    st.booleans()), min_size=1, max_size=8)


@settings(max_examples=300, deadline=None)
@given(processes)
def test_every_name_the_export_writes_is_one_a_restored_capture_may_give(chosen):
    for stem in unique_stems(chosen):
        name = stem + PROCESS_TRACE_SUFFIX  # as merge.finalize_capture names a process's trace
        assert is_process_file_name(name) and is_capture_file_name(name), name


@pytest.mark.parametrize("name", [
    "/etc/passwd", "../../etc/passwd", "worker-pid7/../../x.pt.trace.json.gz", "/worker-pid7.pt.trace.json.gz",
    "worker-pid0.pt.trace.json.gz", "Worker-pid7.pt.trace.json.gz", "worker-pid7.pt.trace.json",
    "worker-pid7.pt.trace.json.gz\n", "worker-rank-pid7.pt.trace.json.gz", "capture.json", "notes.txt", "",
    MERGED_NAME, SUMMARY_NAME, None, 7, ["worker-pid7.pt.trace.json.gz"],
])
def test_no_other_name_is_a_process_file(name):
    assert not is_process_file_name(name)
    assert is_capture_file_name(name) == (name in (MERGED_NAME, SUMMARY_NAME))


def test_only_a_regular_file_of_the_folder_itself_is_opened(tmp_path):
    folder = tmp_path / "capture"
    folder.mkdir()
    (folder / "worker-pid7.pt.trace.json.gz").write_bytes(b"trace")
    with open_capture_file(folder, "worker-pid7.pt.trace.json.gz") as f:
        assert f.read() == b"trace"

    (tmp_path / "secret").write_bytes(b"secret")
    (folder / MERGED_NAME).symlink_to(tmp_path / "secret")
    os.mkfifo(folder / SUMMARY_NAME)  # a FIFO must not hang the open
    (folder / "sub").mkdir()
    for name in (MERGED_NAME, SUMMARY_NAME, "sub", "..", "../secret", str(tmp_path / "secret")):
        with pytest.raises(NotInFolder):
            open_in_folder(folder, name)
    with pytest.raises(NotInFolder):
        open_capture_file(folder, "capture.json")
    with pytest.raises(FileNotFoundError):
        open_capture_file(folder, "worker-pid8.pt.trace.json.gz")

    linked = tmp_path / "linked-capture"
    linked.symlink_to(folder, target_is_directory=True)
    with pytest.raises(NotInFolder):  # the capture's folder itself is not followed either
        open_capture_file(linked, "worker-pid7.pt.trace.json.gz")
