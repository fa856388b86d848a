"""A probe's marker file on its trace root: what its name says, and which markers a probe may clear.

The marker (``<root>/probes/<name>``) tells the sidecar that it shares the probe's file system
(``hello.marker``). Probes leave markers behind when they die, so each probe clears stale ones when
it makes its own. A pid says whether its process lives only inside one pid namespace of one
kernel: a probe in another container sharing the volume (another pid namespace, often the same
host name: the containers of a pod) has a live process whose pid this probe cannot see, or sees as
another process. So a marker names its *pid space* — a digest of its host name, the kernel's boot id
and its pid namespace — and only a marker of this probe's own pid space is cleared because its pid
is gone; any other only once older than ``MAX_AGE_S`` (a live probe touches its marker at each
connection, so only a marker left behind grows that old).

Name: ``<pid>-<random: 32 hex>-<pid space: 16 hex>-<host>`` (host as in file names,
``protocol.file_name_part``). Protocol 9 and older wrote ``<pid>-<random>``: such a marker says
nothing of its pid space, and its probe cannot connect to this version's sidecar anyway, so it goes
when its pid is gone here or by age.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass

from ...common.protocol import MARKER_PATTERN, file_name_part

MAX_AGE_S = 24 * 3600.0
_NAME = re.compile(MARKER_PATTERN)  # the wire's check of hello.marker, with its four parts as groups
_OLD_NAME = re.compile(r"^([0-9]{1,10})-[0-9a-f]{32}\Z")  # protocol 9 and older
_BOOT_ID = "/proc/sys/kernel/random/boot_id"  # one per boot of a kernel: containers share their host's
_PID_NAMESPACE = "/proc/self/ns/pid"  # "pid:[4026531836]": the namespace's inode, unique on its kernel


@dataclass(frozen=True)
class MarkerName:
    pid: int
    random: str
    space: str | None  # None: a marker of protocol 9 or older, which did not say
    host: str = ""

    @property
    def name(self) -> str:
        return f"{self.pid}-{self.random}-{self.space}-{self.host}"

    @classmethod
    def for_this_process(cls, host: str) -> "MarkerName":
        """This process's marker, ``host`` being the name its probe reports (``ProcessIdentity.host``)."""
        return cls(os.getpid(), secrets.token_hex(16), pid_space(host), file_name_part(host))

    @classmethod
    def parse(cls, name: str) -> "MarkerName | None":
        """The marker a file name is, or None for a file that is none (left alone)."""
        match = _NAME.match(name)
        if match and match[1]:  # the pattern also matches "" (no marker)
            return cls(int(match[1]), match[2], match[3], match[4])
        match = _OLD_NAME.match(name)
        return cls(int(match[1]), name.partition("-")[2], None) if match else None

    def pid_is_mine_to_check(self, mine: "MarkerName") -> bool:
        """Whether this marker's pid means a process in ``mine``'s pid space, so that its absence
        there says the marker's probe is gone. An old marker is taken as this space's (as it was)."""
        return self.space is None or self.space == mine.space


def pid_space(host: str) -> str:
    """16 hex digits naming where this process's pid means this process: the host name, the
    kernel's boot id and the pid namespace. Where one cannot be read (not Linux, /proc hidden) it
    counts as "", so the digest falls back on what can be told, the host name at least; two
    containers differ where any of the three does."""
    parts = [host, _read(_BOOT_ID), _readlink(_PID_NAMESPACE)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except (OSError, ValueError):
        return ""


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""
