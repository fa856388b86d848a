"""Capture analysis: what a Kineto / Chrome trace says, at once, in bounded memory.

``analyze_path`` reads a trace file (.json or .json.gz) or a folder of rank files and returns a
JSON-ready summary (schema in docs/analysis.md); ``format_report`` renders it as text;
``TraceFormatError`` is raised for anything unreadable. ``sidecar analyze`` is the command line.
"""

from .errors import TraceFormatError
from .report import format_report
from .summary import SCHEMA_VERSION, analyze_path

__all__ = ["SCHEMA_VERSION", "TraceFormatError", "analyze_path", "format_report"]
