"""Each process's file stem within one capture, unique even across hosts.

A capture names each process's files ``<role>[-rank<k>]-pid<pid>`` (``ProcessIdentity.file_stem``),
unique on one host. Two hosts (or containers) often have processes of the same role, rank and pid
(pid 7 in two containers, worker rank 0 of two data-parallel servers): the files the sidecar fetches
from them (``<capture>/raw/<stem>.json``), the per-process trace files it writes (``<stem>.json.gz``)
and the merge's per-process outcomes would then be one file, the last fetched overwriting the first.

So the stems are settled once, when the capture is created. A process whose files the sidecar reads
where its probe wrote them keeps its own stem wherever it is free; any other process whose stem is
taken gets its host appended, then a number where the host does not tell them apart (two containers
with one host name). A capture of one host keeps every name as it was. (The probes' own raw files,
``ProcessIdentity.probe_file_stem``, carry host and probe id, ``-p<hex>``: a fetched file, whose
stem ends in a host or a number, never takes one's name in a shared raw folder.)

``WRITTEN_STEM`` is every stem this gives, as a pattern built beside the code that makes them: a
name read back from a restored ``capture.json`` is served only if it matches (safe_files.py), and a
test feeds ``unique_stems`` hostile host names to keep the two in step.
"""

from __future__ import annotations

import re
from typing import Sequence

from ...common.protocol import HOST_CHARS, ROLE_PATTERN, ProcessIdentity, file_name_part

# ``ProcessIdentity.file_stem`` (the role as ROLE_PATTERN allows it, ``-rank<k>``, ``-pid<n>``), then
# what ``unique_stems`` appends: ``-<file_name_part(host)>`` (at most HOST_CHARS of letters, digits and
# ``_.-``), then ``-<k>``. No ``/`` can occur: a stem is never a path.
_ROLE = ROLE_PATTERN.removeprefix("^").removesuffix(r"\Z")
WRITTEN_STEM = re.compile(
    rf"{_ROLE}(?:-rank[0-9]+)?-pid[1-9][0-9]*(?:-[A-Za-z0-9_.-]{{1,{HOST_CHARS}}}(?:-[0-9]+)?)?")


def unique_stems(processes: Sequence[tuple[ProcessIdentity, bool]]) -> list[str]:
    """The stem of each (identity, its files are read where they lie) in the order given: distinct,
    and its own ``file_stem`` wherever that is free."""
    out: list[str | None] = [None] * len(processes)
    used: set[str] = set()
    for i, (identity, local) in enumerate(processes):  # local processes first: they keep their plain names
        if local and identity.file_stem not in used:
            out[i] = identity.file_stem
            used.add(identity.file_stem)
    for i, (identity, _local) in enumerate(processes):
        if out[i] is not None:
            continue
        base = identity.file_stem
        candidates = [base, f"{base}-{file_name_part(identity.host)}"]
        stem = next((c for c in candidates if c not in used), None)
        k = 2
        while stem is None:
            stem = f"{candidates[1]}-{k}" if f"{candidates[1]}-{k}" not in used else None
            k += 1
        out[i] = stem
        used.add(stem)
    return [s for s in out if s is not None]

