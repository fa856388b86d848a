"""Always-on sync watch for CUDA hosts: torch's sync debug mode, confined to the step thread.

``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronising CUDA call inside torch (stream
and device synchronize, blocking copies to the host, ``.item()``, ``nonzero``, ...) raise the
Python warning "called a synchronizing CUDA operation" in the thread that made it. The mode is one
process-global setting, which is why vLLM only uses it in CI. The watch keeps it from touching
other threads:

* It is switched on only for sampled steps (one working step in ``every``), by the step thread at
  the step's start, and switched off at its end.
* A ``warnings.showwarning`` hook takes the sync warnings of the step thread and records their
  site. It drops the sync warnings other threads raise while the mode is on (which they would not
  have raised without the watch), so nothing is printed or raised anywhere. Every other warning
  goes to the previous hook unchanged.
* A filter for that one message, first in ``warnings.filters`` with action ``always``, makes
  repeated syncs at one line count each time (the default action shows a warning once per
  location) and keeps a later ``simplefilter("error")`` from turning them into exceptions. If other
  code displaced the hook or the filter (``warnings.catch_warnings`` restores what it saw), the
  next sampled step puts them back before switching the mode on.

It does not start where CUDA is not available, nor where the application set the sync debug mode
itself (its warnings or errors are its own); a step where the mode is found set is not sampled.

What it reports per site: file:line, function, phase (sites.py), count, count per sampled step,
first and last engine step, and expected/hidden from the allowlist. torch's warning does not say
which operation synced nor how long it blocked: ``op`` is ``cuda_sync``, and an on-demand scan
(scan.py) names the operation and times it.

Cost: steps not sampled pay one counter increment; a sampled step two calls into torch; each sync
seen a warning object and a walk up the stack (tens of microseconds).
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any, Callable, Optional, Protocol

from .allowlist import HIDDEN, Allowlist
from .sites import Site, SiteLocator

SYNC_WARNING = "called a synchronizing CUDA operation"  # c10/cuda/CUDAFunctions.h warn_or_error_on_sync
WATCH_OP = "cuda_sync"
DEFAULT_EVERY = 16
_OFF, _WARN = 0, 1  # torch's sync debug mode values: disabled, warn (2 is error)
_WARNINGS_FILE = warnings.__file__


class DebugModeSwitch(Protocol):
    def get(self) -> int: ...
    def set(self, mode: int) -> None: ...


class TorchSyncDebugMode:
    """torch's own switch (``torch.cuda.get/set_sync_debug_mode``)."""

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def get(self) -> int:
        return int(self._torch.cuda.get_sync_debug_mode())

    def set(self, mode: int) -> None:
        self._torch.cuda.set_sync_debug_mode(mode)


def cuda_unavailable_reason() -> Optional[str]:
    """Why torch's sync debug mode cannot be used in this process; None when it can."""
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a dependency
        return f"torch cannot be imported: {exc}"
    try:
        if not torch.cuda.is_available():
            return "CUDA is not available in this process (the watch needs torch's CUDA sync debug mode)"
    except Exception as exc:
        return f"CUDA check failed: {exc}"
    return None


class _SiteCount:
    __slots__ = ("site", "count", "first_step", "last_step")

    def __init__(self, site: Site, step: int) -> None:
        self.site, self.count, self.first_step, self.last_step = site, 0, step, step


class SyncWatch:
    """Drive with ``step_begin(has_work, step)`` / ``step_end()`` on the step thread."""

    def __init__(
        self,
        switch: Optional[DebugModeSwitch] = None,
        every: int = DEFAULT_EVERY,
        allowlist: Optional[Allowlist] = None,
        locator: Optional[SiteLocator] = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be at least 1, got {every}")
        self.every = every
        self._switch = switch if switch is not None else TorchSyncDebugMode()
        self._allowlist = allowlist if allowlist is not None else Allowlist()
        self._locator = locator or SiteLocator()
        self._sites: dict[tuple, _SiteCount] = {}
        self._thread: Optional[int] = None
        self._previous_hook: Optional[Callable[..., Any]] = None
        self._hook_fn = self._hook  # one bound method, so that `is` can tell it is still installed
        self._filter: Optional[tuple] = None
        self._working_steps = 0
        self._step = -1
        self.on = False  # the mode is switched on by this watch right now
        self.installed = False
        self.sampled_steps = 0
        self.skipped_steps = 0  # sampled steps left alone: the application had set the mode itself
        self.dropped = 0  # other threads' sync warnings dropped while the mode was on
        self.errors = 0  # internal failures, each swallowed so the step goes on
        self.version = 0  # grows with every change a report would show

    # -- lifecycle -----------------------------------------------------------------------------------
    def install(self) -> None:
        """Hook the warnings machinery (any thread; the step thread is learnt at its first step)."""
        if self.installed:
            return
        self._previous_hook = warnings.showwarning
        warnings.showwarning = self._hook_fn
        warnings.filterwarnings("always", message=SYNC_WARNING)
        self._filter = warnings.filters[0]
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        if self.on:
            self._switch_off()
        if warnings.showwarning is self._hook_fn:
            warnings.showwarning = self._previous_hook
        if self._filter in warnings.filters:
            warnings.filters.remove(self._filter)
            getattr(warnings, "_filters_mutated", lambda: None)()  # invalidate cached decisions
        self.installed = False

    # -- the step path ---------------------------------------------------------------------------------
    def step_begin(self, has_work: bool, step: int) -> None:
        if not has_work or not self.installed:
            return
        self._working_steps += 1
        if self._working_steps % self.every:
            return
        try:
            if self._switch.get() != _OFF:  # the application's own setting: leave it alone
                self.skipped_steps += 1
                return
            self._ensure_hooked()
            self._thread = threading.get_ident()
            self._step = step
            self._switch.set(_WARN)
            self.on = True
        except Exception:
            self.errors += 1

    def step_end(self) -> None:
        if self.on:
            self._switch_off()
            self.sampled_steps += 1
            self.version += 1

    def _switch_off(self) -> None:
        self.on = False
        try:
            self._switch.set(_OFF)
        except Exception:
            self.errors += 1

    def _ensure_hooked(self) -> None:
        if warnings.showwarning is not self._hook_fn:
            self._previous_hook = warnings.showwarning
            warnings.showwarning = self._hook_fn
        if not warnings.filters or warnings.filters[0] is not self._filter:
            if self._filter in warnings.filters:
                warnings.filters.remove(self._filter)
            warnings.filterwarnings("always", message=SYNC_WARNING)
            self._filter = warnings.filters[0]

    # -- the warnings hook ---------------------------------------------------------------------------
    def _hook(self, message, category, filename, lineno, file=None, line=None) -> None:
        if str(message).startswith(SYNC_WARNING) and self._ours(message):
            return
        previous = self._previous_hook
        if previous is not None:
            previous(message, category, filename, lineno, file, line)

    def _ours(self, message) -> bool:
        """True when the warning came from the watch's mode and is now taken care of."""
        if threading.get_ident() == self._thread and self.on:
            try:
                self._record(sys._getframe(2))
            except Exception:
                self.errors += 1
            return True
        try:
            mode = self._switch.get()
        except Exception:
            mode = _OFF
        if self.on or mode == _OFF:
            # Another thread, during a sampled step (or its warning surfaced just after one):
            # without the watch it would not have been raised.
            self.dropped += 1
            return True
        return False  # the application set the mode itself: its warning

    def _record(self, frame) -> None:
        while frame is not None and frame.f_code.co_filename == _WARNINGS_FILE:
            frame = frame.f_back
        frame = self._locator.site_frame(frame)
        if frame is None:
            return
        key = (frame.f_code, frame.f_lineno)
        entry = self._sites.get(key)
        if entry is None:
            entry = self._sites[key] = _SiteCount(self._locator.describe(frame), self._step)
        entry.count += 1
        entry.last_step = self._step

    # -- reporting (any thread) ------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        """The watch's findings so far, JSON-ready (docs/syncs.md, "Always-on watch")."""
        sampled = self.sampled_steps
        sites = []
        for entry in list(self._sites.values()):
            s = entry.site
            site = {
                "file": s.file, "path": s.path, "line": s.line, "function": s.function, "op": WATCH_OP,
                "phase": s.phase, "count": entry.count,
                "count_per_step": round(entry.count / sampled, 3) if sampled else float(entry.count),
                "first_step": entry.first_step, "last_step": entry.last_step,
            }
            site["classification"], site["reason"] = self._allowlist.classify(site)
            sites.append(site)
        sites.sort(key=lambda s: (s["classification"] != HIDDEN, -s["count"], s["path"], s["line"]))
        return {
            "state": "watching" if self.installed else "stopped",
            "every": self.every,
            "sampled_steps": sampled,
            "skipped_steps": self.skipped_steps,
            "dropped_other_threads": self.dropped,
            "errors": self.errors,
            "sites": sites,
        }
