"""Capture analysis: what a Kineto / Chrome trace says, at once, in bounded memory.

``analyze_path`` reads a trace file (.json or .json.gz) or a folder of rank files and returns a
JSON-ready summary (schema in docs/analysis.md); ``format_report`` renders it as text;
``TraceFormatError`` is raised for anything unreadable. ``sidecar analyze`` is the command line.

The names below are loaded on first use: importing the package, or a light module of it such as the
command line's ``cli``, imports no numpy, so a command can set up its process before numpy loads
(``one_shot.py``).
"""

from __future__ import annotations

import importlib
from typing import Any

# The package's API: name -> the module that defines it.
_PUBLIC = {
    "SCHEMA_VERSION": ".summary",
    "analyze_path": ".summary",
    "TraceFormatError": ".errors",
    "format_report": ".report",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later reads are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
