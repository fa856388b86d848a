"""Which sync sites are expected: the engine's deliberate transfers (its profile's
``allow_entries``, see ``sidecar.engine``) plus the user's own, from a JSON file (format in
docs/syncs.md).

An entry matches a site when every field it gives matches: ``path`` is a glob against the site's
import-relative path (``vllm/v1/worker/gpu_model_runner.py``), ``function`` and ``op`` compare
exactly, ``line`` is optional (lines move between versions; functions rarely do).
"""

from __future__ import annotations

import fnmatch
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

log = logging.getLogger(__name__)

EXPECTED, HIDDEN = "expected", "hidden"
_FIELDS = ("path", "function", "op", "line", "reason")


@dataclass(frozen=True)
class AllowEntry:
    path: str
    function: Optional[str] = None
    op: Optional[str] = None
    line: Optional[int] = None
    reason: str = ""

    def matches(self, site: Mapping[str, Any]) -> bool:
        if not (fnmatch.fnmatchcase(site["path"], self.path) or fnmatch.fnmatchcase(site["file"], "*/" + self.path)):
            return False
        if self.function is not None and site["function"] != self.function:
            return False
        if self.op is not None and site["op"] != self.op:
            return False
        return self.line is None or site["line"] == self.line

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None and v != ""}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "AllowEntry":
        if not isinstance(d, Mapping):
            raise ValueError(f"allowlist entry must be an object, got {d!r}")
        unknown = sorted(set(d) - set(_FIELDS))
        if unknown:
            raise ValueError(f"allowlist entry has unknown field {unknown[0]!r}; known: {', '.join(_FIELDS)}")
        path = d.get("path")
        if not isinstance(path, str) or not path:
            raise ValueError(f"allowlist entry needs a non-empty string 'path': {dict(d)!r}")
        line = d.get("line")
        if line is not None and (not isinstance(line, int) or isinstance(line, bool)):
            raise ValueError(f"allowlist entry 'line' must be an integer: {dict(d)!r}")
        return cls(path=path, function=d.get("function"), op=d.get("op"), line=line, reason=str(d.get("reason", "")))


class Allowlist:
    """Ordered entries; the first that matches a site classes it ``expected``. The core has no entries
    of its own: an engine's come from its profile (``EngineProfile.allow_entries``)."""

    def __init__(self, entries: Iterable[AllowEntry] = ()) -> None:
        self.entries = tuple(entries)

    def extended(self, more: Iterable[AllowEntry]) -> "Allowlist":
        return Allowlist(self.entries + tuple(more))

    def match(self, site: Mapping[str, Any]) -> Optional[AllowEntry]:
        return next((e for e in self.entries if e.matches(site)), None)

    def classify(self, site: Mapping[str, Any]) -> tuple[str, str]:
        entry = self.match(site)
        return (EXPECTED, entry.reason) if entry is not None else (HIDDEN, "")


def load_entries(path: str | Path) -> list[AllowEntry]:
    """A JSON file holding a list of entries, or an object with an ``allow`` list. Raises ValueError
    (with the file named) for anything else."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read allowlist {path}: {exc}") from None
    if isinstance(data, Mapping):
        data = data.get("allow")
    if not isinstance(data, list):
        raise ValueError(f"allowlist {path}: expected a list of entries or {{\"allow\": [...]}}")
    try:
        return [AllowEntry.from_json(d) for d in data]
    except ValueError as exc:
        raise ValueError(f"allowlist {path}: {exc}") from None


def from_environment(base: Iterable[AllowEntry] = ()) -> Allowlist:
    """``base`` (the engine profile's entries) plus those of the file named by SIDECAR_SYNC_ALLOWLIST.
    A bad file is logged and skipped: the scan still runs, with ``base``."""
    from .settings import ENV_ALLOWLIST, allowlist_path

    allowlist = Allowlist(base)
    path = allowlist_path()
    if path is None:
        return allowlist
    try:
        return allowlist.extended(load_entries(path))
    except ValueError as exc:
        log.warning("inference-sidecar: %s ignored: %s", ENV_ALLOWLIST, exc)
        return allowlist
