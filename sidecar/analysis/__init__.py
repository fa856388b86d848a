"""Capture analysis: what a Kineto / Chrome trace says, at once, in bounded memory.

``analyze_path`` reads a trace file (.json or .json.gz) or a folder of rank files and returns a
JSON-ready summary (schema in docs/analysis.md); ``format_report`` renders it as text;
``TraceFormatError`` is raised for anything unreadable. ``sidecar analyze`` is the command line.

The names below are loaded on first use, so that importing a light submodule (the reader, the
errors) does not import numpy and every analysis: ``sidecar analyze`` reads its trace in a child
forked before those imports (preload.py).
"""

from __future__ import annotations

import importlib
from typing import Any

# The public names: name -> the submodule that defines it.
_PUBLIC = {
    "SCHEMA_VERSION": "summary",
    "analyze_path": "summary",
    "format_report": "report",
    "TraceFormatError": "errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:  # also how ``from sidecar.analysis import stream`` finds a submodule
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
