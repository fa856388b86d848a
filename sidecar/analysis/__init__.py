"""Capture analysis: what a Kineto / Chrome trace says, at once, in bounded memory (docs/analysis.md).

``analyze_path`` reads a trace file (.json or .json.gz) or a folder of rank files and returns a
JSON-ready summary; ``format_report`` renders it as text; ``TraceFormatError`` is raised for anything
unreadable. ``sidecar analyze`` (sidecar/cli/analyze.py) is the command line.

    summary     ``analyze_path``: a trace in, the stable summary dict out (it asks every question)
    text        ``format_report``: the summary as text for a terminal, most telling figures first
    sync_sites  ``scan_trace``: sync sites from a Kineto trace, in the sync detector's report model
    reader/     reading a trace in bounded memory, in one process or two
    questions/  one module per question the summary answers
    diff/       ``sidecar diff``: two summaries compared

The names below are loaded on first use: importing the package imports no numpy, so a command can
set up its process before numpy loads (sidecar/cli/one_shot.py).
"""

from __future__ import annotations

import importlib
from typing import Any

# The package's API: name -> the module that defines it.
_PUBLIC = {
    "SCHEMA_VERSION": ".summary",
    "analyze_path": ".summary",
    "TraceFormatError": ".reader.errors",
    "format_report": ".text",
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
