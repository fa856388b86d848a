"""Where a sync came from: the first Python frame outside torch and outside this project, and the
step phase its call stack belongs to.

A ``SiteLocator`` caches one decision per code object, so walking the stack costs a few dict
lookups per frame. Phases come from a small ordered rule table (``PhaseRule``): the innermost frame
that matches a rule decides; no match is ``other``. The rules are the engine's: an engine profile
(``sidecar.engine.EngineProfile.phase_rules``) carries them, and the core has none of its own.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Iterable, Optional

FORWARD, SAMPLING, SCHEDULING, OTHER = "forward", "sampling", "scheduling", "other"
PHASES = (FORWARD, SAMPLING, SCHEDULING, OTHER)


@dataclass(frozen=True)
class PhaseRule:
    """A frame matches when its file path contains ``path_part`` (if given) and its function is one
    of ``functions`` (if given)."""

    phase: str
    path_part: str = ""
    functions: frozenset[str] = frozenset()

    def matches(self, code: CodeType) -> bool:
        return self.matches_location(code.co_filename, code.co_name)

    def matches_location(self, filename: str, function: str) -> bool:
        if self.path_part and self.path_part not in filename.replace(os.sep, "/"):
            return False
        return not self.functions or function in self.functions


def _package_dir(module_name: str) -> Optional[str]:
    """The folder of an importable package (with a trailing separator); None if it cannot be imported."""
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            return None
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


# This project's own package: ``sidecar/`` (this file is sidecar/syncs/sites.py).
_PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def default_skip_dirs(packages: Iterable[str] = ()) -> tuple[str, ...]:
    """Folders whose frames are never a site: torch's, this project's (``sidecar``), and those of
    ``packages`` (import names: an engine integration's own package, from its profile's
    ``skip_packages``). A package that cannot be imported is left out."""
    dirs = (_package_dir("torch"), _PROJECT_DIR, *(_package_dir(p) for p in packages))
    return tuple(dict.fromkeys(d for d in dirs if d))


@dataclass(frozen=True)
class Site:
    file: str  # absolute path
    path: str  # relative to the sys.path entry holding it (stable across hosts: baselines use it)
    line: int
    function: str
    phase: str


class SiteLocator:
    """``skip_dirs``: path prefixes whose frames are passed over (None: ``default_skip_dirs()``);
    ``phase_rules``: the engine's rule table (``EngineProfile.phase_rules``; none: every site is
    ``other``)."""

    def __init__(self, skip_dirs: Iterable[str] | None = None, phase_rules: Iterable[PhaseRule] = ()) -> None:
        self._skip_dirs = tuple(skip_dirs) if skip_dirs is not None else default_skip_dirs()
        self._rules = tuple(phase_rules)
        self._skip: dict[str, bool] = {}
        self._phase: dict[CodeType, Optional[str]] = {}
        self._paths: dict[str, str] = {}

    def locate(self, frame: Optional[FrameType]) -> Optional[Site]:
        """The site for a call whose innermost Python frame is ``frame``; None if every frame is
        torch's or this project's."""
        frame = self.site_frame(frame)
        return None if frame is None else self.describe(frame)

    def site_frame(self, frame: Optional[FrameType]) -> Optional[FrameType]:
        """The first frame outward from ``frame`` that is neither torch's nor this project's."""
        while frame is not None and self._skipped(frame.f_code.co_filename):
            frame = frame.f_back
        return frame

    def describe(self, frame: FrameType) -> Site:
        """The site of a frame ``site_frame`` returned (its phase from the whole stack above it)."""
        code = frame.f_code
        return Site(
            file=code.co_filename,
            path=self._relative(code.co_filename),
            line=frame.f_lineno,
            function=code.co_name,
            phase=self._phase_of(frame),
        )

    def _skipped(self, filename: str) -> bool:
        skip = self._skip.get(filename)
        if skip is None:
            skip = self._skip[filename] = filename.startswith(self._skip_dirs)
        return skip

    def _phase_of(self, frame: Optional[FrameType]) -> str:
        cache = self._phase
        while frame is not None:
            code = frame.f_code
            if code in cache:
                phase = cache[code]
            else:
                phase = cache[code] = next((r.phase for r in self._rules if r.matches(code)), None)
            if phase is not None:
                return phase
            frame = frame.f_back
        return OTHER

    def _relative(self, filename: str) -> str:
        rel = self._paths.get(filename)
        if rel is None:
            rel = self._paths[filename] = relative_path(filename)
        return rel


def relative_path(filename: str) -> str:
    """``/venv/.../site-packages/vllm/v1/x.py`` → ``vllm/v1/x.py``: the longest sys.path entry wins."""
    best = ""
    for entry in sys.path:
        if not entry:
            continue
        base = os.path.abspath(entry) + os.sep
        if filename.startswith(base) and len(base) > len(best):
            best = base
    return filename[len(best):].replace(os.sep, "/") if best else filename.replace(os.sep, "/")
