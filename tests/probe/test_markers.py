"""Probe markers on a shared trace volume: which markers a probe clears when it makes its own.

A pid not alive here stands for a process this probe cannot see: gone, if the marker is of this
probe's pid space; in another container or on another host (alive or not, this probe cannot tell)
if the marker says another pid space.
"""

import asyncio
import os
import time

import msgspec
import pytest

from sidecar.probe.capture.marker import MAX_AGE_S, MarkerName, pid_space
from sidecar.probe.capture.trace_root import TraceRoot
from sidecar.common.protocol import Hello, ProcessIdentity
from sidecar.common.protocol_codec import PROTOCOL_VERSION, ProtocolError, decode_hello, encode

UNSEEN_PID = 2**22 + 5  # above any pid here: no process of this host's namespace has it


def marker(host: str, space: str | None = None, pid: int = UNSEEN_PID) -> MarkerName:
    return MarkerName(pid, os.urandom(16).hex(), space or pid_space(host), host)


@pytest.mark.parametrize("a, b", [
    (marker("pod-a"), marker("pod-b")),  # two hosts
    (marker("pod", space="0" * 16), marker("pod", space="1" * 16)),  # one host name, two pid namespaces
], ids=["two host names", "two pid namespaces"])
def test_two_probes_of_one_pid_in_other_pid_spaces_keep_each_others_live_markers(tmp_path, a, b):
    """Two containers sharing one volume, their probes both pid 5 in their own namespaces (a pid no
    process here has): whichever starts second must not clear the other's marker, which the sidecar
    looks for at the other's next connection."""
    volume = TraceRoot(tmp_path / "volume")
    probes = tmp_path / "volume" / "probes"
    for first, second in ((a, b), (b, a)):
        assert volume.make_marker(first) == first.name
        assert volume.make_marker(second) == second.name
        assert sorted(p.name for p in probes.iterdir()) == sorted([a.name, b.name])
        for m in (a, b):
            volume.remove_marker(m.name)


def test_a_marker_of_this_pid_space_whose_process_is_gone_goes(tmp_path):
    root = TraceRoot(tmp_path / "root")
    here = pid_space("node-1")
    gone = marker("node-1", space=here)
    root.make_marker(gone)
    mine = MarkerName(os.getpid(), os.urandom(16).hex(), here, "node-1")
    root.make_marker(mine)
    assert [p.name for p in (tmp_path / "root" / "probes").iterdir()] == [mine.name]


def test_a_marker_of_another_pid_space_goes_only_once_old(tmp_path):
    root = TraceRoot(tmp_path / "root")
    young, old = marker("pod-a"), marker("pod-a")
    (tmp_path / "root" / "probes").mkdir(parents=True)
    for m in (young, old):  # two probes of pod-a, each seeing the other alive
        (tmp_path / "root" / "probes" / m.name).touch()
    aged = time.time() - MAX_AGE_S - 60
    os.utime(tmp_path / "root" / "probes" / old.name, (aged, aged))
    mine = root.make_marker(marker("pod-b", pid=os.getpid()))
    assert sorted(p.name for p in (tmp_path / "root" / "probes").iterdir()) == sorted([young.name, mine])


def test_markers_of_older_probes_go_when_their_pid_is_gone_or_by_age_and_other_files_stay(tmp_path):
    """A protocol-9 marker (``<pid>-<random>``) says no pid space: it goes when its pid is not alive
    here, as it did; one of a live pid stays until old. A file that is no marker is left alone."""
    probes = tmp_path / "root" / "probes"
    probes.mkdir(parents=True)
    dead, live, other = f"{UNSEEN_PID}-{'0' * 32}", f"{os.getpid()}-{'1' * 32}", "README"
    for name in (dead, live, other):
        (probes / name).touch()
    assert MarkerName.parse(dead) == MarkerName(UNSEEN_PID, "0" * 32, None)
    mine = TraceRoot(tmp_path / "root").make_marker()
    assert sorted(p.name for p in probes.iterdir()) == sorted([live, other, mine])
    aged = time.time() - MAX_AGE_S - 60
    os.utime(probes / live, (aged, aged))
    os.utime(probes / other, (aged, aged))
    TraceRoot(tmp_path / "root").make_marker()
    assert live not in {p.name for p in probes.iterdir()} and (probes / other).exists()


def test_refresh_makes_a_cleared_marker_again_and_young(tmp_path):
    """The probe touches its marker before each hello: cleared (by age, say) while it was connected,
    it is there again when the sidecar looks for it at the next connection."""
    root = TraceRoot(tmp_path / "root")
    name = root.make_marker()
    path = tmp_path / "root" / "probes" / name
    aged = time.time() - MAX_AGE_S - 60
    os.utime(path, (aged, aged))
    root.refresh_marker(name)
    assert time.time() - path.stat().st_mtime < MAX_AGE_S
    path.unlink()
    root.refresh_marker(name)
    assert path.is_file()


def test_the_marker_name_says_pid_random_pid_space_and_host(tmp_path):
    mine = MarkerName.for_this_process("node 2.example")  # a host name as in file names
    assert mine.name.startswith(f"{os.getpid()}-") and mine.name.endswith("-node_2.example")
    assert MarkerName.parse(mine.name) == mine
    assert mine.space == pid_space("node 2.example") != pid_space("node-3")


def test_hello_carries_the_new_marker_and_refuses_an_older_one():
    process = ProcessIdentity(role="worker", role_label="worker", step_driven=True, pid=7, host="pod")
    name = MarkerName.for_this_process("pod").name

    def hello(marker: str) -> bytes:
        return encode(Hello(protocol=PROTOCOL_VERSION, process=process, nonce="0" * 64,
                            files_at="/volume", marker=marker))

    assert decode_hello(hello(name)).marker == name
    for bad in (f"7-{'0' * 32}", f"{name}/..", name.replace(name.split("-")[2], "x" * 16)):
        with pytest.raises((ProtocolError, msgspec.ValidationError)):
            decode_hello(hello(bad))


async def test_a_marker_cleared_while_its_probe_lives_is_made_again_before_the_hello(tmp_path, real_sidecar):
    """Against the real sidecar, sharing the probe's trace root: a probe whose marker another probe
    cleared (by age, say) still has its files read on the volume at its next connection."""
    from aiohttp import ClientSession

    from sidecar.engine import GENERIC
    from sidecar.probe.link import SidecarLink
    from sidecar.common.protocol import Heartbeat

    url = real_sidecar.url
    root = TraceRoot(tmp_path / "volume")
    name = root.make_marker()
    (tmp_path / "volume" / "probes" / name).unlink()  # cleared meanwhile
    link = SidecarLink(url, GENERIC.identity("worker", 0, pid=os.getpid(), host="pod"), on_message=lambda m: None,
                       on_disconnect=lambda: None, heartbeat=lambda: Heartbeat(steps=0),
                       token_provider=lambda: real_sidecar.probe_token,
                       files_at=str(tmp_path / "volume"), marker=name, before_hello=lambda: root.refresh_marker(name))
    processes = []
    try:
        link.start()
        async with ClientSession() as session:
            for _ in range(100):
                processes = (await (await session.get(url + "/processes")).json())["processes"]
                if processes:
                    break
                await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(link.close)
    assert [p["files_shared"] for p in processes] == [True], processes
